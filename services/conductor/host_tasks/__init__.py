"""Host tasks: draining and evacuating whole hosts as durable conductor work.

keel-manage (``host drain|evacuate``) and keel-api (``os-keel-host-tasks``) record a task
(:mod:`shared.host_task_requests`); every conductor's sweep (:mod:`.sweep`) carries the
running ones out, so a task outlives the client that asked and any conductor's restart.
:mod:`.movers` says how each server is moved, :mod:`.gates` what the host must be for
moves to start, :mod:`.follow` how the moves under way end.
"""
