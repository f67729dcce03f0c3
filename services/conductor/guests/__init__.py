"""The guests agents find on their hosts, and what each is to become.

An agent reports every guest of its host at start-up and periodically (``report_guests``);
:mod:`~services.conductor.guests.verdicts` gives each a fate — keep it, start it, leave
it shut down while its move is under way, or remove it — from the server's row, its copy
token and its whole move history. No other module condemns a copy.
"""
