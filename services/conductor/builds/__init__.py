"""Building a server: from keel-api's request to a running guest, or to ERROR in time.

* :mod:`~services.conductor.builds.task` schedules the server, claims its host and asks
  that host's agent to build it;
* what the agent reports back (the build's result) and asks before it builds
  (``check_build``) is handled by :mod:`services.conductor.instance_events`;
* :mod:`~services.conductor.builds.deadline` puts a build that overran
  ``KEEL_BUILD_TIMEOUT`` in ERROR and releases its claims.

A move's new copy is built by the same agent call, on behalf of :mod:`services.conductor.moves`.
"""
