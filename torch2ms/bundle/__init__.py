"""Deployment bundles for Atlas boards: ``build`` writes one, ``verify`` checks one.

A bundle is a reproducible ``<name>-<version>.tar.gz``; ``manifest.json`` inside lists the
sha256 of every other file. ``archive`` writes and safely reads the tarball, ``targets`` holds
the board table and the converter_lite / ATC / AIPP files, ``compat`` the compatibility report,
``templates/`` the bundle's ``infer.py`` and README.
"""
