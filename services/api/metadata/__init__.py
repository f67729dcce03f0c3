"""The metadata service: what guests read of themselves at 169.254.169.254.

keel-api serves it on a listener of its own (``KEEL_METADATA__BIND``), never beside the
compute API. Guests do not reach it themselves: the agent of a guest's host passes the
guest's requests on, adding the guest's id and its signature (see :mod:`.app`).
"""
