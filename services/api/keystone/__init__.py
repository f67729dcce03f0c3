"""keel-api behind a real Keystone (``KEEL_IDENTITY__KEYSTONE_URL``).

keel-api then serves no identity of its own (no ``/identity`` routes, no tokens table
lookups): each ``X-Auth-Token`` is validated against Keystone with keel-api's service
credentials, as keystonemiddleware's ``auth_token`` does, and the user, project and
roles come from Keystone's answer. :mod:`.client` speaks to Keystone; :mod:`.tokens`
caches its answers for ``KEEL_IDENTITY__TOKEN_CACHE_TIME`` seconds at most.
"""
