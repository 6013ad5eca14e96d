"""The whole Redis keyspace of fxworker, in one place.

Every key of session S is `<prefix>:{S}:<name>`. The braces are Redis Cluster's hash tag:
only `S` is hashed, so all of a session's keys live in one slot and every Lua script
(each touches one session) runs on one node. Two index keys span sessions; they share the
tag `{~index}` (a session id never contains `~`), so they too sit in one slot together. No
script mixes them with a session's keys on a cluster; on a standalone server (no slots)
accept.lua takes both, to mark the session ready in the same call that stores its input.

Per session (all touched only by the scripts in `fxworker/lua/` unless said otherwise;
every one gets the session TTL when a session finishes with `FX_SESSION_TTL_S` set, and
loses it again when new input is accepted):

    meta      HASH    agent, created_ms, head (last log cursor), ui (last UI cursor),
                      inbox (last inbox seq), turn / turn_seq / yielded / cutoffs /
                      deaths / step / turn_cursor (the open turn; turn_cursor: the UI
                      cursor of its turn_start line), turns, last_turn, cancel (the
                      message id a cancel targets), steers / steer_bytes (queued steers),
                      expiring (1 while the session's keys carry the retention TTL),
                      line_key (the newest line-only call key, see `keys`),
                      epoch (the last claim's: the lease's count survives the lease
                      key), context (the session's tool context: the last one an input
                      gave, used by every input that gives none), unserved_ms /
                      unserved_n / unserved_next_ms (a wake found no process running
                      the agent: first miss, misses, next wake; cleared by a claim that
                      runs it), rest (1 while `rest` holds the log), through (the
                      stored checkpoint's: `ckpt` must exist). At rest the open
                      turn's fields are gone (read as 0 or "").
                      Written by accept, append, claim, release, cancel; save_checkpoint
                      clears line_key; ack_read writes ui back as it was (a read's
                      replicated write under FX_ACK=replica or aof). Its counters
                      say which other keys must exist (lua/_whole.lua): a session
                      missing one is refused whole (the inbox only while an input
                      waits or a turn is open).
    lease     HASH    holder, epoch, expires_ms, state (held | released). The epoch
                      never goes down, even across releases. claim, renew, release;
                      checked by append and save_checkpoint.
    inbox     STREAM  accepted inputs and cancel requests, id `<seq>-0`; fields k
                      (p | s | c), id, in, cx?, st? (only when given), at. accept, cancel; read by claim and
                      by a running worker's polling XREAD (`watch_inbox`); trimmed by
                      save_checkpoint below the oldest input still needed, and
                      deleted by a release that leaves the session at rest (the next
                      accept adds its `<seq>-0` to a new one).
    log       STREAM  engine journal records, id `<cursor>-0`; fields k (idempotency
                      key), d (opaque bytes), e (writer epoch), m (marks JSON). append;
                      read by claim; trimmed by save_checkpoint. At rest it is in `rest`.
    ui        STREAM  NDJSON lines of §4, id `<cursor>-0`, field l (the JSON text, with
                      `epoch` and `cursor` inside); or, packed at rest, a chunk of lines
                      first..last as one entry `<last>-0`, fields f (first) and z (their
                      NDJSON compressed, `store/_packed.py`). append; read with XREAD
                      (read_lines, which expands chunks). At rest, release rewrites it
                      to its size (DUMP and RESTORE: Redis allocates a stream's last
                      node at 4 KiB).
    msgs      HASH    message-id index: id -> "kind:state:seq:end_cursor:bytes" with kind
                      p | s, state w (waiting) | r (open turn) | d (done). accept, append.
    pending   ZSET    ids not yet consumed, scored by inbox seq (acceptance order).
                      accept, append; read by claim, cancel, state.
    keys      HASH    idempotency key -> "cursor:first_line:last_line" of the call that
                      stored it. Besides the records' keys it holds the newest line-only
                      call key (a line flush's `lines:<epoch>:<n>`, named by meta
                      line_key) -> "head:first_line:last_line", head being the log head
                      the flush followed; append replaces it with the next one. append;
                      pruned by save_checkpoint with the records, and of the line-only
                      key once a later record is covered.
    ckpt      HASH    data (opaque bytes, <= 4 MiB; stored compressed behind `FXZ\x01`
                      when smaller, `store/_packed.py`), through (log cursor it covers).
                      save_checkpoint, and append when its end record lets the session
                      go (through that record); read by claim and load.
    rest      STRING  a session at rest's log, as one value (a stream costs some 400 B of
                      its own; one value costs its bytes). Written by a release that
                      leaves the session at rest, which deletes the log; put back into
                      the log by the next claim, which deletes it. Read by load.
                      Items `<length>:<bytes>`, three per record: cursor, d, e
                      (lua/_rest.lua, `_replies.parse_rest`).

Across sessions (tag `{~index}`, no TTL):

    ready     ZSET    session id -> ms of the last mark. Written *before* the input is
                      stored: first thing in accept.lua on a standalone server, by
                      mark_ready.lua before accept.lua on a cluster (another slot). Read
                      by the sweeper, pruned by clear_ready.lua only for marks older than
                      a grace period (see `fxworker.store`).
    sessions  ZSET    session id -> ms first seen. Written with every ready mark; read by
                      list_sessions.

Outside the scripts (plain commands, no hash tag, no session TTL):

    sweeper                  STRING  who sweeps now (`sweeper_guard_key`)
    sweeper:newer:<level>    STRING  who sweeps the sessions let go for that layout level while an
                                     older release holds `sweeper` (`Sweeper.sweep_newer`)
    workers:<hostname>       STRING  a started Celery worker's pid (`worker_ready_key`)
    wake:seen:<signature>    STRING  a signed wake already taken (`wake_seen_key`)
    created:[<scope>:]<message id>  STRING  the session a create with that message id
                                     made, per caller scope (`created_session_key`)
    celery:dead              LIST    messages a worker could not decode, newest first,
                                     capped at 1,000 (`DEAD_LETTER_LIST`, fxworker.broker)
"""

from __future__ import annotations

from dataclasses import dataclass, field

INDEX_TAG = "{~index}"

# The broker's dead-letter list, under kombu's key prefix `<prefix>:celery:`: undecodable
# messages taken off a queue (fxworker.broker), each a JSON object {queue, reason, at_ms, raw}.
DEAD_LETTER_LIST = "dead"

# The order scripts receive a session's keys in (KEYS[1]..KEYS[10]); every Lua header
# repeats it.
SESSION_KEY_NAMES = ("meta", "lease", "inbox", "log", "ui", "msgs", "pending", "keys", "ckpt", "rest")


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """Every key of one session, in the order `SESSION_KEY_NAMES` gives the scripts."""

    meta: str
    lease: str
    inbox: str
    log: str
    ui: str
    msgs: str
    pending: str
    keys: str
    ckpt: str
    rest: str
    # The ten names in script order, built once: every script call sends them.
    names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = (self.meta, self.lease, self.inbox, self.log, self.ui, self.msgs, self.pending, self.keys, self.ckpt,
                 self.rest)
        object.__setattr__(self, "names", names)

    def all(self) -> list[str]:
        return list(self.names)


@dataclass(frozen=True, slots=True)
class IndexKeys:
    """The cross-session keys (one slot of their own): the ready set and the session index
    (`names`, what scripts take), and the parked turns' timeouts (`waits`, a ZSET of
    `<timeout s>|<session id>` scored by when the wait ends)."""

    ready: str
    sessions: str
    waits: str = ""
    names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", (self.ready, self.sessions))

    def all(self) -> list[str]:
        return list(self.names)


def check_prefix(prefix: str) -> str:
    """A prefix may not contain braces or spaces: it would break the hash tags."""
    if not prefix or any(c in prefix for c in "{} \t\r\n"):
        raise ValueError(f"invalid key prefix {prefix!r}: no braces or whitespace")
    return prefix


def session_keys(prefix: str, session_id: str) -> SessionKeys:
    """The keys of `session_id` under `prefix`, all tagged `{session_id}`."""
    base = f"{prefix}:{{{session_id}}}:"
    return SessionKeys(*(base + name for name in SESSION_KEY_NAMES))


def index_keys(prefix: str) -> IndexKeys:
    """The ready set, the session index and the waits' timeouts under `prefix`, tagged `{~index}`."""
    return IndexKeys(ready=f"{prefix}:{INDEX_TAG}:ready", sessions=f"{prefix}:{INDEX_TAG}:sessions",
                     waits=f"{prefix}:{INDEX_TAG}:waits")


def sweeper_guard_key(prefix: str) -> str:
    """Which worker process sweeps now (`fxworker.sweeper`)."""
    # STRING, PX = 0.9 x the sweep interval (at least 50 ms): the value is the sweeping process's token,
    # set with SET NX PX. Not a session key (no hash tag).
    return f"{prefix}:sweeper"


def worker_ready_key(prefix: str, hostname: str) -> str:
    """The pid of the Celery worker `hostname` once it consumes (`fxworker.sweeper`)."""
    # STRING, 1 h TTL: set with SET EX when the worker is ready; tests wait on it.
    return f"{prefix}:workers:{hostname}"


def live_workers_key(prefix: str) -> str:
    """The live worker processes and the agents each runs (`fxworker.liveness`)."""
    # HASH worker id -> JSON mark `{v: 1, agents, expiresMs, freeSinceMs, tookSentMs, host,
    # pid, reads}` (fxworker/store/_live.py reads and checks it), written by each worker
    # process (and each web process, with no agent: it announces the layout level it reads)
    # every second (HSET, and PEXPIRE of the whole key: a deployment gone leaves nothing);
    # marks expired for a minute are deleted by the sweeper's reads. Not a session key.
    return f"{prefix}:live"


def wake_seen_key(prefix: str, signature: str) -> str:
    """A signed wake already taken by a web process (`fxworker.web.wake`)."""
    # STRING, PX = twice the wake window: a signature stays taken for as long as its
    # timestamp is accepted (either side of now). SET NX PX; deleted when the delivery
    # should be let through again. Not a session key (no hash tag).
    return f"{prefix}:wake:seen:{signature.removeprefix('sha256=')}"


def created_session_key(prefix: str, message_id: str, scope: str = "") -> str:
    """The session that `POST /v1/sessions` with `message_id` created (`RedisStore.session_for_message`),
    within `scope` (the web app's: the agent and the session's pinned context, hashed), so one
    caller's message id never names another's session."""
    # STRING, the session TTL (`FX_SESSION_TTL_S`, none when unset), counted from the create:
    # the session id, set with SET NX (PX) before the first prompt is accepted, so a repeated
    # create prompts the same session and `accept` answers it as repeated. A message id has
    # no braces, so the key has no hash tag: one key, any slot. Not a session key.
    return f"{prefix}:created:{scope}:{message_id}" if scope else f"{prefix}:created:{message_id}"


def queue_name(agent: str) -> str:
    """The Celery queue of one agent name, `fx.<name>` (the broker list `<prefix>:celery:fx.<name>`)."""
    return f"fx.{agent}"
