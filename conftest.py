"""This repository's own cases (cases/) and tests (tests/).

Strata itself loads through its pytest11 entry point once installed (``pip install .``
or the editable install that scripts/setup.sh makes); nothing here registers it.
"""
