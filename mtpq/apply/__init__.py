"""apply.py (standard library and git only): its command line (apply_command), the series as a patched
wheel (wheel) and the rebase matrix (matrix); applying to a tree or an installation is mtpq.core's."""
