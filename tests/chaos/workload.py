"""The workload of a chaos run: session drivers, stream readers, and the model's script.

Each `Driver` keeps one session going at a time: its `SessionDriver` sends a few prompts over
HTTP (the first one creates the session), without waiting for turns to end, and a steer now
and then, and then the driver starts a new session (so a long run keeps its load); every
request carries a message id and is resent under it until the API acknowledges it (202)
or refuses it (4xx); a 5xx (503 `FX_STORE_UNAVAILABLE` while Redis restarts, 503
`FX_STORE_FULL` while its memory is squeezed) is resent like a lost connection, and recorded
(`retried`, with its code). Each acknowledgement is recorded (`ack`), in the order the driver
got them: one driver sends one request at a time, so that is the session's acceptance order.
At its next step a driver also sends the bursts of steers and cancels the callers asked it
for (`Storms`, `tests.chaos.callers`), back to back, each cancel recorded (`cancel`).

Each `Reader` follows one session's stream from cursor 0 and drops its connection at random
(after a few lines, or when no line came within a random read timeout), then resumes from
the last cursor it saw, as `fx tail` does. Once its session's driver sent its last input
and the reader saw every acknowledged prompt end, it stops following until the run's last
read to the end (`follow=0`). It keeps every stored line it was sent, so the checker can
compare them with the stream the store holds (§11.7).

`ModelScript` is the scripted model's responder. The prompt text says what the turn does:

- `echo:<tag>`: text after a random delay;
- `probe:<tag>` / `effect:<tag>`: one idempotent / not idempotent call that runs a while;
- `both:<tag>`: both kinds of call in one response (the effect runs alone, after the probe);
- `chain:<tag>:<n>`: n probe calls in a row (long enough to yield at the soft stop);
- `slow:<tag>`: a call that outlasts every delivery (cut off until the third cut-off);
- `refund:<tag>`: one or two `refund` calls in one response (the script's draw): the turn
  parks until each is decided (`tests.chaos.approvals` answers over HTTP), then text;
- `delegate:<tag>`: one or two calls of `delegate` in one response (the script's draw),
  each handing a child session of agent `default` the prompt `effect:<tag>-c<n>`,
  `probe:<tag>-c<n>` or `echo:<tag>-c<n>`: the turn parks until each child's turn ends and
  answers its call, then text naming the answers (the child turns are not the drivers':
  the run finds them in the parent's lines, `tests.chaos.run.children`);
- `steer:<tag>` (a steer's text): text answering the steer;
- `typed:<tag>`, the only prompt of a session of the agent `typed` (`TYPED_SHARE` of the
  drivers' sessions, and driver 1's first one, are such sessions): a turn that answers with
  a `tests.chaos.tooling.TypedAnswer` through the final-result tool. The script answers any
  request that offers that tool (`offers_final_result`) with a call of it: a request of a
  `typed:<tag>` turn that carries no validation errors gets an invalid one (`{"tag"}`, `n`
  missing) on `TYPED_INVALID_SHARE` of its draws, else a valid one, `{"tag": <tag>, "n":
  <a number of its own>}`, sometimes (`TYPED_PROBE_SHARE`) after a `probe` call in the
  same response (`t-<tag>`: the answer ends the turn, the probe must not run); a request
  that carries the errors (the final-result call's result, "The arguments did not
  validate ...") or whose turn's last input is a steer gets a valid one naming that
  input's tag. Each answer is recorded (`typed_answer`: the tag, valid or not, `n`, whether
  the request carried the errors, the worker's pid, whether it stalled, the wall time)
  for the checker's `typed:` rules. The nemesis's `typed` fault arms a kill
  (`arm_typed_kill`): the next invalid answer the script serves calls it with the pid of
  the worker that asked, which the nemesis kills about when the reply has been sent.
`<tag>` is `s<driver>g<session>.<prompt>`; the script keeps, per session, the pid of the worker
process that made its last model request (from the `x-fx-pid` header), which is how the
nemesis knows which sessions a worker it kills was running.

Its pauses stay under `MODEL_IDLE_TIMEOUT_S`, except where the nemesis armed a stall
(`arm_stall`): the next model request (and, for `repeat=2`, the one after it of the same
session) goes silent for `ms`, before its first chunk or after one, and the script records
it (`stalled`); the workers' `transport.error` diagnostics say which timed out.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from fxengine.output import FINAL_RESULT_TOOL
from fxengine.testing import Reply, delay, text, tool_call
from fxengine.testing.script import Delay, Text
from tests.chaos.faults import pid_of, tool_results, turn_prompt
from tests.chaos.history import History
from tests.chaos.system import MODEL_IDLE_TIMEOUT_S
from tests.chaos.tooling import DELEGATE_TOOL, TYPED_AGENT

ACK_TIMEOUT_S = 45.0
SLOW_TOOL_S = 60
# The longest ordinary pause of the script: below the workers' idle timeout with room to
# spare on a loaded machine, so only an armed stall trips it.
LONG_PAUSE_MS = (1000.0, MODEL_IDLE_TIMEOUT_S * 700)
# What a `delegate:<tag>` prompt hands its children (weights): real work, a non-idempotent
# effect most often.
CHILD_KINDS = (("effect", 3), ("probe", 1), ("echo", 2))
STALL_WHERE = ("before", "after")
# Sessions of the agent `typed` (every prompt `typed:<tag>`): this share of the drivers'
# sessions (drawn per session, not from the session's own draws), besides driver 1's first.
TYPED_SHARE = 0.15
TYPED_INVALID_SHARE = 0.5  # first tries of a typed turn answered with an invalid final result
TYPED_PROBE_SHARE = 0.3  # valid answers of a `typed:<tag>` turn given after a probe call
# How the engine answers an invalid final-result call (`fxengine.output.Output._invalid`).
TYPED_RETRY_PREFIX = "The arguments did not validate"


def prompt_tag(prompt: str) -> str:
    """The tag of a prompt or steer text (`<kind>:<tag>[:<extra>]`)."""
    return prompt.partition(":")[2].partition(":")[0]


def offers_final_result(request: Any) -> bool:
    """Whether a model request offers the final-result tool: a turn of a typed agent."""
    return any(isinstance(t, dict) and (t.get("function") or {}).get("name") == FINAL_RESULT_TOOL
               for t in request.body.get("tools") or [])


@dataclass
class Stall:
    """A silence the nemesis armed: where in the stream, how long, for how many requests."""

    where: str
    ms: float
    repeat: int = 1

    def into(self, reply: Reply) -> Reply:
        """`reply` with a silence of `ms` before its first chunk or after one."""
        parts = list(reply.parts)
        lead = 1 if parts and isinstance(parts[0], Delay) else 0  # the script's own pause first
        if self.where == "before":
            parts.insert(lead, delay(self.ms))
        elif lead < len(parts) and isinstance(parts[lead], Text) and len(parts[lead].pieces) > 1:
            first, rest = parts[lead].pieces[:1], parts[lead].pieces[1:]
            parts[lead:lead + 1] = [Text(first), delay(self.ms), Text(rest)]
        else:  # a reply that starts with a call: some text first, then the silence
            parts[lead:lead] = [text("thinking "), delay(self.ms)]
        return Reply(*parts, chunk_delay_ms=reply.chunk_delay_ms)


class ModelScript:
    """The responder of the chaos model server (see the module doc); thread-safe."""

    def __init__(self, seed: int, api_key: str, history: History | None = None) -> None:
        self._rng = random.Random(f"model-{seed}")
        self._lock = threading.Lock()
        self._api_key = api_key
        self._history = history
        self._armed: list[Stall] = []
        self._stalling: dict[str, Stall] = {}  # session tag -> the stall its next request repeats
        self.last_pid: dict[str, int] = {}
        self.requests = 0
        self.keyed_requests = 0
        self._answers = 0  # the `n` of the last valid typed answer
        # What the nemesis armed (`arm_typed_kill`): called with the pid of the worker served
        # the next invalid typed answer and the seconds until that reply has been sent.
        self._typed_kills: list[Callable[[int, float], None]] = []

    def _ms(self) -> float:
        with self._lock:
            if self._rng.random() < 0.1:
                return self._rng.uniform(*LONG_PAUSE_MS)
            return self._rng.uniform(20, 400)

    def arm_typed_kill(self, kill: Callable[[int, float], None]) -> None:
        """The next invalid answer to a typed turn calls `kill(pid, seconds)` (the worker that
        asked, and how long until the reply is sent)."""
        with self._lock:
            self._typed_kills.append(kill)

    def disarm_typed_kills(self) -> int:
        """Drops the typed kills not yet fired; how many there were."""
        with self._lock:
            n, self._typed_kills = len(self._typed_kills), []
        return n

    def arm_stall(self, stall: Stall) -> None:
        """The next model request (of any session) goes silent as `stall` says."""
        with self._lock:
            self._armed.append(stall)

    def _stall_for(self, session: str, request: Any) -> Stall | None:
        """The stall this request of `session` plays, if any (see the module doc)."""
        with self._lock:
            stall = self._stalling.pop(session, None) or (self._armed.pop(0) if self._armed else None)
            if stall is not None and stall.repeat > 1:
                self._stalling[session] = Stall(stall.where, stall.ms, stall.repeat - 1)
        if self._history is not None and stall is not None:
            self._history.record("stalled", session=session, where=stall.where, ms=stall.ms,
                                 pid=request.headers.get("x-fx-pid"))
        return stall

    def _run_ms(self) -> int:
        with self._lock:
            return self._rng.randint(200, 1500)

    def _note(self, request: Any, tag: str) -> None:
        with self._lock:
            self.requests += 1
            if request.headers.get("authorization") == f"Bearer {self._api_key}":
                self.keyed_requests += 1
            try:
                self.last_pid[tag.split(".")[0]] = pid_of(request)
            except (KeyError, ValueError):
                pass

    def _call(self, name: str, args: dict[str, Any]) -> Any:
        return tool_call(f"call_{uuid.uuid4().hex[:10]}", name, args)

    def __call__(self, request: Any) -> Reply:
        prompt, _ = turn_prompt(request)
        tag = prompt_tag(prompt)
        answer: dict[str, Any] | None = None
        if offers_final_result(request):
            reply, answer = self._typed(request, prompt)
        else:
            reply = self._reply(request, prompt)
        stall = self._stall_for(tag.split(".")[0], request)
        if answer is not None and self._history is not None:
            self._history.record("typed_answer", **answer, stalled=stall is not None, wall=round(time.time(), 4))
        if answer is not None and not answer["valid"]:
            self._fire_typed_kill(answer, reply, stall)
        return reply if stall is None else stall.into(reply)

    def _fire_typed_kill(self, answer: dict[str, Any], reply: Reply, stall: Stall | None) -> None:
        with self._lock:
            kill = self._typed_kills.pop(0) if self._typed_kills else None
        if kill is None or not answer.get("pid"):
            return
        ms = sum(p.ms for p in reply.parts if isinstance(p, Delay)) + (stall.ms if stall is not None else 0.0)
        kill(int(answer["pid"]), ms / 1000.0)

    def _typed(self, request: Any, prompt: str) -> tuple[Reply, dict[str, Any]]:
        """A final-result call answering a request of a typed turn (see the module doc), and
        the record of it."""
        kind, _, arg = prompt.partition(":")
        tag = arg.partition(":")[0]
        self._note(request, tag)
        retry = any(r.startswith(TYPED_RETRY_PREFIX) for r in tool_results(request))
        wait = delay(self._ms())
        with self._lock:
            valid = kind != "typed" or retry or self._rng.random() >= TYPED_INVALID_SHARE
            probe = kind == "typed" and valid and self._rng.random() < TYPED_PROBE_SHARE
            n = None
            if valid:
                self._answers += 1
                n = self._answers
        args: dict[str, Any] = {"tag": tag, "n": n} if valid else {"tag": tag}
        calls = [self._call(FINAL_RESULT_TOOL, args)]
        if probe:
            calls.insert(0, self._call("probe", {"name": f"t-{tag}"}))
        record = {"session": tag.split(".")[0], "tag": tag, "input": kind, "valid": valid, "n": n, "retry": retry,
                  "probe": probe, "pid": request.headers.get("x-fx-pid")}
        return Reply(wait, *calls), record

    def _reply(self, request: Any, prompt: str) -> Reply:
        results = tool_results(request)
        kind, _, arg = prompt.partition(":")
        tag, _, extra = arg.partition(":")
        self._note(request, tag)
        wait = delay(self._ms())
        if kind in ("probe", "effect"):
            if results:
                return Reply(wait, text("done ", tag))
            return Reply(wait, self._call(kind, {"name": f"{kind[0]}-{tag}", "ms": self._run_ms()}))
        if kind == "both":
            if results:
                return Reply(wait, text("both done ", tag))
            return Reply(wait, self._call("probe", {"name": f"p-{tag}", "ms": self._run_ms()}),
                         self._call("effect", {"name": f"e-{tag}", "ms": self._run_ms()}))
        if kind == "chain":
            if len(results) < int(extra or 1):
                return Reply(wait, self._call("probe", {"name": f"p-{tag}-{len(results)}", "ms": 1300}))
            return Reply(wait, text("chained ", tag))
        if kind == "slow":
            if results:
                return Reply(wait, text("slow done ", tag))
            return Reply(wait, self._call("slow", {"seconds": SLOW_TOOL_S}))
        if kind == "refund":
            if results:
                return Reply(wait, text("refund done ", tag))
            with self._lock:
                calls = self._rng.choice((1, 1, 2))
            return Reply(wait, *(self._call("refund", {"name": f"r-{tag}-{n}", "amount": 10 + n})
                                 for n in range(calls)))
        if kind == "delegate":
            if results:
                return Reply(wait, text("delegated ", f"{tag}: " + " | ".join(r[:60] for r in results)))
            with self._lock:
                calls = self._rng.choice((1, 1, 2))
                kinds = [self._rng.choices(*zip(*CHILD_KINDS))[0] for _ in range(calls)]
            return Reply(wait, *(self._call(DELEGATE_TOOL, {"input": f"{k}:{tag}-c{n}"})
                                 for n, k in enumerate(kinds)))
        if kind == "steer":
            return Reply(wait, text("steered ", tag))
        return Reply(wait, text("echo ", tag), chunk_delay_ms=5)


# ----------------------------------------------------------------------------- drivers

PROMPT_KINDS = (("echo", 3), ("probe", 2), ("effect", 3), ("both", 2), ("chain", 1), ("refund", 2), ("delegate", 2))


def prompt_text(rng: random.Random, tag: str) -> str:
    kinds, weights = zip(*PROMPT_KINDS)
    kind = rng.choices(kinds, weights)[0]
    return f"chain:{tag}:6" if kind == "chain" else f"{kind}:{tag}"


class Driver:
    """Keeps one session going until `stop_at`: a session of up to `prompts` prompts, then a new one."""

    def __init__(self, index: int, base_url: str, seed: int, history: History, stop_at: float, *,
                 prompts: int = 6, first_prompt: str | None = None) -> None:
        self.index = index
        self.base_url = base_url
        self.seed = seed
        self.history = history
        self.stop_at = stop_at
        self.prompts = prompts
        self.first_prompt = first_prompt
        self.sessions: list[SessionDriver] = []
        self.storms = Storms()
        self.thread = threading.Thread(target=self.run, name=f"chaos-driver-{index}", daemon=True)

    def start(self) -> Driver:
        self.thread.start()
        return self

    def typed(self, generation: int) -> bool:
        """Whether the session of this generation is of the agent `typed` (see the module doc;
        never one that opens with a `first_prompt`)."""
        if self.first_prompt is not None:
            return False
        return (self.index == 1 and generation == 0) or \
            random.Random(f"typed-{self.seed}-{self.index}-{generation}").random() < TYPED_SHARE

    def run(self) -> None:
        generation = 0
        while time.monotonic() < self.stop_at:
            session = SessionDriver(f"{self.index}g{generation}", self.base_url, self.seed, self.history,
                                    self.stop_at, max_prompts=self.prompts, first_prompt=self.first_prompt,
                                    storms=self.storms, agent=TYPED_AGENT if self.typed(generation) else None)
            self.sessions.append(session)
            session.run()  # an input never acknowledged ends its session: order holds per session
            generation += 1


@dataclass
class SessionDriver:
    """Sends one session's prompts and steers until `stop_at` (see the module doc)."""

    name: str
    base_url: str
    seed: int
    history: History
    stop_at: float
    max_prompts: int = 6
    first_prompt: str | None = None
    storms: Storms | None = None
    agent: str | None = None  # the agent a create names (None: the server's default)
    wait_until: float | None = None  # the drain waits for its inputs until then (None: to its end)
    session_id: str | None = None
    acked: list[dict[str, Any]] = field(default_factory=list)
    reader: Reader | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(f"driver-{self.seed}-{self.name}")
        self._stormed = 0

    @property
    def tag(self) -> str:
        """The session's tag in prompt texts (`s<name>`), by which the model script knows it."""
        return f"s{self.name}"

    def run(self) -> bool:
        """Sends the session's inputs; False when one was refused or never acknowledged (the
        session gets no more: what was sent stays in acceptance order)."""
        try:
            return self._run()
        finally:
            if self.reader is not None:
                self.reader.retire({a["messageId"] for a in self.acked if a["input"] == "prompt"})

    def _run(self) -> bool:
        with httpx.Client(base_url=self.base_url, timeout=10.0) as http:
            for n in range(self.max_prompts):
                if time.monotonic() >= self.stop_at:
                    return True
                tag = f"{self.tag}.{n}"
                text_ = f"{self.first_prompt}:{tag}" if n == 0 and self.first_prompt else prompt_text(self.rng, tag)
                if self.agent == TYPED_AGENT:
                    text_ = f"typed:{tag}"  # the draw above still made: the session's other draws stay as seeded
                if not self.send(http, "prompt", text_, f"m-{self.seed}-{tag}"):
                    return False
                for k in range(self.rng.choice((0, 0, 1, 1, 2))):
                    time.sleep(self.rng.uniform(0.1, 1.5))
                    if not self.send(http, "steer", f"steer:{tag}.{k}", f"m-{self.seed}-{tag}-s{k}"):
                        return False
                if not self._storm(http, tag):
                    return False
                time.sleep(self.rng.uniform(0.5, 4.0))
        return True

    def _storm(self, http: httpx.Client, tag: str) -> bool:
        """Sends the bursts of steers and cancels the callers asked for (`Storms`), back to
        back: against the running turn and the prompts waiting behind it."""
        for kinds in self.storms.take() if self.storms is not None else []:
            status = self.state(http).get("status")
            self.history.record("storm", session=self.session_id, driver=self.name, kinds=kinds, status=status)
            for kind in kinds:
                self._stormed += 1
                if kind == "cancel":
                    sent = self.cancel(http)
                else:
                    sent = self.send(http, "steer", f"steer:{tag}.x{self._stormed}", f"m-{self.seed}-{tag}-x{self._stormed}")
                if not sent:
                    return False
        return True

    def cancel(self, http: httpx.Client) -> bool:
        """`POST .../cancel` until it is acknowledged (True) or refused or never answered;
        each acknowledgement is recorded (`cancel`, with the session's epoch when sent)."""
        deadline = time.monotonic() + ACK_TIMEOUT_S
        attempts = 0
        while time.monotonic() < deadline:
            attempts += 1
            try:
                response = http.post(f"/v1/sessions/{self.session_id}/cancel")
            except httpx.HTTPError:
                time.sleep(self.rng.uniform(0.2, 0.8))
                continue
            if response.status_code in (200, 202):
                self.history.record("cancel", session=self.session_id, driver=self.name, attempts=attempts)
                return True
            if response.status_code < 500:
                self.history.record("refused", session=self.session_id, input="cancel", messageId=None,
                                    status=response.status_code, body=response.text[:300])
                return False
            self.history.record("retried", session=self.session_id, input="cancel", messageId=None,
                                status=response.status_code, code=_code(response))
            time.sleep(self.rng.uniform(0.2, 0.8))
        self.history.record("unacked", session=self.session_id, input="cancel", messageId=None, attempts=attempts)
        return False

    def state(self, http: httpx.Client) -> dict[str, Any]:
        """`GET /v1/sessions/{id}` (an empty dict when it cannot be read now)."""
        try:
            response = http.get(f"/v1/sessions/{self.session_id}")
        except httpx.HTTPError:
            return {}
        return dict(response.json()) if response.status_code == 200 else {}

    def _path(self, kind: str) -> str:
        if self.session_id is None:
            return "/v1/sessions"
        return f"/v1/sessions/{self.session_id}/{'steer' if kind == 'steer' else 'prompts'}"

    def send(self, http: httpx.Client, kind: str, text_: str, message_id: str) -> bool:
        """Sends one input until it is acknowledged (True) or refused or never answered (False)."""
        deadline = time.monotonic() + ACK_TIMEOUT_S
        attempts = 0
        body = {"input": text_, "messageId": message_id}
        if self.session_id is None and self.agent is not None:
            body["agent"] = self.agent
        while time.monotonic() < deadline:
            attempts += 1
            try:
                response = http.post(self._path(kind), json=body)
            except httpx.HTTPError:
                time.sleep(self.rng.uniform(0.2, 0.8))
                continue
            if response.status_code in (200, 202):
                reply = response.json()
                self.session_id = self.session_id or reply["sessionId"]
                ack = self.history.record("ack", session=self.session_id, driver=self.name, input=kind,
                                          messageId=message_id, text=text_, attempts=attempts,
                                          repeated=bool(reply.get("repeated")), agent=self.agent or "default")
                self.acked.append(ack)
                if self.reader is None:
                    self.reader = Reader(self.session_id, self.base_url, self.seed, self.history).start()
                return True
            if response.status_code < 500:
                self.history.record("refused", session=self.session_id, input=kind, messageId=message_id,
                                    status=response.status_code, body=response.text[:300])
                return False
            self.history.record("retried", session=self.session_id, input=kind, messageId=message_id,
                                status=response.status_code, code=_code(response))
            time.sleep(self.rng.uniform(0.2, 0.8))
        self.history.record("unacked", session=self.session_id, input=kind, messageId=message_id, attempts=attempts)
        return False


class Storms:
    """The bursts the callers asked one driver for (`tests.chaos.callers`): each a list of
    `steer` / `cancel`, taken by whichever of its sessions sends next; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bursts: list[list[str]] = []

    def ask(self, kinds: list[str]) -> None:
        with self._lock:
            self._bursts.append(list(kinds))

    def take(self) -> list[list[str]]:
        with self._lock:
            bursts, self._bursts = self._bursts, []
        return bursts


def _code(response: httpx.Response) -> str | None:
    """The `FX_` code of an error reply (`{"error": {"code": ...}}`), None when it has none."""
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


# ----------------------------------------------------------------------------- readers


class Reader:
    """Follows one session's stream, dropping and resuming its connection at random."""

    def __init__(self, session_id: str, base_url: str, seed: int, history: History) -> None:
        self.session_id = session_id
        self.base_url = base_url
        self.history = history
        self.rng = random.Random(f"reader-{seed}-{session_id}")
        self.seen: list[dict[str, Any]] = []
        self.cursor = 0
        self.connections = 0
        self.drops = 0
        self.unstored = 0
        self._finish = threading.Event()
        self._expected: set[str] | None = None
        self._ended: set[str] = set()
        self.last_end_t: float | None = None  # when (history time) the last turn_end came
        self.caught_up = threading.Event()
        self.thread = threading.Thread(target=self.run, name=f"chaos-reader-{session_id}", daemon=True)

    def start(self) -> Reader:
        self.thread.start()
        return self

    def finish(self) -> None:
        """Asks for a last read to the end of what is stored (`follow=0`), then stops."""
        self._finish.set()

    def retire(self, prompts: set[str]) -> None:
        """No more input comes: stop following once these prompts' `turn_end` lines came
        (then only the last read of `finish()` remains)."""
        self._expected = set(prompts)

    def _idle(self) -> bool:
        return self._expected is not None and self._expected <= self._ended

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url) as http:
            while not self.caught_up.is_set():
                if self._idle():
                    self._finish.wait()
                finishing = self._finish.is_set()
                if self._read_once(http, follow=not finishing) and finishing:
                    self.caught_up.set()
                    return
                time.sleep(self.rng.uniform(0.05, 0.3))

    def _read_once(self, http: httpx.Client, *, follow: bool) -> bool:
        """One connection; True when it ended cleanly at the end of what was sent."""
        self.connections += 1
        budget = self.rng.randint(1, 40) if follow else 1_000_000
        timeout = httpx.Timeout(10.0, read=self.rng.uniform(0.3, 2.5) if follow else 10.0)
        params = {"cursor": self.cursor, "follow": 1 if follow else 0}
        try:
            with http.stream("GET", f"/v1/sessions/{self.session_id}/stream", params=params, timeout=timeout) as r:
                if r.status_code != 200:
                    self.drops += 1
                    return False
                for raw in r.iter_lines():
                    if not raw.strip():
                        continue
                    line = json.loads(raw)
                    if "cursor" not in line:  # an error the web process sent, not a stored line
                        self.unstored += 1
                        return False
                    self.seen.append(line)
                    if line["type"] == "turn_end":
                        self._ended.add(line.get("messageId"))
                        self.last_end_t = round(self.history.now(), 3)
                    self.cursor = max(self.cursor, int(line["cursor"]))
                    budget -= 1
                    if budget == 0 or self._idle():
                        return False  # a deliberate disconnect
            return True
        except httpx.HTTPError:
            self.drops += 1
            return False
