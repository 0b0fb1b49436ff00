"""What the three concerns (apply/, checkpoint/, upstream/) share, standard library and git only: the
pinned releases (pin) and their series (series), sha256-verified downloads (download), crash-safe file
steps (crashsafe), the series on a vLLM git tree (gittree) and on an installed vLLM (installed) with each
patch's outcome (status), MtpqError, the base of every error mtpq reports as one line (errors), and
the files the package carries (package_data)."""
