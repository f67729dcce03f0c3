"""The operator's page as HTML: the login form, and the page whose tables its script fills.

Rendered on the server from constant templates; the only values put in them (a user
name, a message, the CSRF token) are escaped. No inline script or style: the page's
Content-Security-Policy allows only its own files (:mod:`services.api.ops.pages`).
"""

from __future__ import annotations

from html import escape

_HEAD = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{meta}<title>{title}</title>
<link rel="stylesheet" href="/ops/static/ops.css">
{script}</head>
"""

_LOGIN = """<body class="login">
<main>
<h1>keel operations</h1>
<p>Sign in as an admin of this cloud.</p>
{message}<form method="post" action="/ops/login" autocomplete="on">
<p><label for="username">User name</label>
<input id="username" name="username" autocomplete="username" required maxlength="255"
 value="{username}" autofocus></p>
<p><label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password"
 required maxlength="1024"></p>
<p><button type="submit" id="login">Sign in</button></p>
</form>
</main>
</body>
</html>
"""

_PAGE = """<body>
<a class="skip" href="#hosts-heading">Skip to the hosts</a>
<header>
<h1>keel operations</h1>
<p class="who">Signed in as <strong>{user}</strong></p>
<form method="post" action="/ops/logout">
<input type="hidden" name="csrf_token" value="{csrf}">
<button type="submit" id="logout">Sign out</button>
</form>
</header>
<p id="updated" class="muted">Loading…</p>
<p id="status" class="error" role="status" aria-live="polite"></p>
<noscript><p class="error">This page needs JavaScript to show and update its tables.
Its data is at /ops/api/hosts, /ops/api/moves, /ops/api/host-tasks, /ops/api/versions
and /ops/api/events.</p>
</noscript>
<main>
<section aria-labelledby="hosts-heading">
<h2 id="hosts-heading">Compute hosts</h2>
<div class="scroll"><table id="hosts">
<caption>Every compute host, refreshed every few seconds.</caption>
<thead><tr>
<th scope="col">Host</th><th scope="col">State</th><th scope="col">Scheduling</th>
<th scope="col">Fencing</th><th scope="col">Release</th><th scope="col">Last heartbeat</th>
<th scope="col">Servers</th><th scope="col">Actions</th>
</tr></thead>
<tbody></tbody>
</table></div>
</section>
<section aria-labelledby="moves-heading">
<h2 id="moves-heading">Moves in flight</h2>
<div class="scroll"><table id="moves">
<caption>Evacuations and migrations not yet ended, newest first.</caption>
<thead><tr>
<th scope="col">Type</th><th scope="col">Server</th><th scope="col">From</th>
<th scope="col">To</th><th scope="col">Status</th><th scope="col">Started</th>
<th scope="col">Deadline</th>
</tr></thead>
<tbody></tbody>
</table></div>
</section>
<section aria-labelledby="tasks-heading">
<h2 id="tasks-heading">Host tasks</h2>
<div class="scroll"><table id="host-tasks">
<caption>Drains and evacuations of whole hosts, carried out by the conductors: running
ones first, with their servers.</caption>
<thead><tr>
<th scope="col">Task</th><th scope="col">Host</th><th scope="col">Status</th>
<th scope="col">Progress</th><th scope="col">Moving</th><th scope="col">Failed</th>
<th scope="col">Deadline</th><th scope="col">Message</th>
</tr></thead>
<tbody></tbody>
</table></div>
</section>
<section aria-labelledby="versions-heading">
<h2 id="versions-heading">Releases and RPC pins</h2>
<p id="waiting-for"></p>
<div class="scroll"><table id="pins">
<caption>The highest version of each RPC API keel-api sends now.</caption>
<thead><tr>
<th scope="col">RPC API</th><th scope="col">Setting</th><th scope="col">Cap</th>
<th scope="col">Latest</th><th scope="col">Follows</th><th scope="col">Releases running</th>
</tr></thead>
<tbody></tbody>
</table></div>
</section>
<section aria-labelledby="events-heading">
<h2 id="events-heading">Recent fences and evacuations</h2>
<p id="fenced-now"></p>
<div class="scroll"><table id="evacuations">
<caption>The latest evacuations (by keel-recovery: automatic).</caption>
<thead><tr>
<th scope="col">Server</th><th scope="col">From</th><th scope="col">To</th>
<th scope="col">Status</th><th scope="col">By</th><th scope="col">Asked</th>
</tr></thead>
<tbody></tbody>
</table></div>
<div class="scroll"><table id="recoveries">
<caption>Fenced hosts the conductors evacuated on their own.</caption>
<thead><tr>
<th scope="col">Host</th><th scope="col">Started</th><th scope="col">Evacuations</th>
<th scope="col">Skipped</th>
</tr></thead>
<tbody></tbody>
</table></div>
</section>
<section aria-labelledby="activity-heading">
<h2 id="activity-heading">What you did</h2>
<ol id="activity" aria-live="polite"></ol>
</section>
</main>
<dialog id="confirm" aria-labelledby="confirm-title" aria-describedby="confirm-text">
<form method="dialog">
<h2 id="confirm-title"></h2>
<p id="confirm-text"></p>
<p id="confirm-reason-row" hidden><label for="confirm-reason">Reason</label>
<input id="confirm-reason" maxlength="255"></p>
<ul id="confirm-list"></ul>
<p class="buttons">
<button type="submit" value="cancel" id="confirm-cancel">Cancel</button>
<button type="submit" value="confirm" id="confirm-ok" class="danger">Confirm</button>
</p>
</form>
</dialog>
</body>
</html>
"""


def login_page(*, message: str = "", username: str = "") -> str:
    shown = f'<p class="error" role="alert">{escape(message)}</p>\n' if message else ""
    head = _HEAD.format(meta="", title="keel operations: sign in", script="")
    return head + _LOGIN.format(message=shown, username=escape(username))


def ops_page(*, user: str, csrf: str) -> str:
    head = _HEAD.format(
        meta=f'<meta name="csrf-token" content="{escape(csrf)}">\n',
        title="keel operations",
        script='<script src="/ops/static/ops.js" defer></script>\n',
    )
    return head + _PAGE.format(user=escape(user), csrf=escape(csrf))
