"""The single controller on Ray: resource pools, role hosts, dispatch, colocation and discovery.

Importing this package does not import Ray; the modules that need it import it themselves.
"""
