"""The chaos run: workload + nemesis + checker on real processes (`make chaos`).

    python -m tests.chaos.run [--duration S] [--seed N] [--sessions S] [--workers N] [--cluster]

Starts the system (`tests.chaos.system`), runs the session drivers, the nemesis and the
callers (`tests.chaos.callers`; not with `--no-callers`) for `--duration` seconds, and the
deciders of parked calls (`tests.chaos.approvals`) until the drain ends, with the
wake queues sampled and the `late` agent's wakes let through a valve (`tests.chaos.wakes`),
stops the faults, lets every acknowledged input run to its end (at most `--drain` seconds;
a `ghost` session's until its give-up has had time), and every child session's turn (the
delegated calls of `delegate:<tag>` prompts, found in their parents' lines), has every reader read to the end of its stream, then reads the
store and checks the history (`tests.chaos.checker`). Prints a table of figures, writes
`<--out>/chaos-<seed>.json` (figures, violations, settings), the history as JSON lines and
what the store held (`.store.json`: streams, tool starts, worker diagnostics) beside it,
and exits 1 on any violation, printing the seed that replays the schedule. Besides §11 it
checks the run itself: no worker process exited that no fault killed or stopped, and the
poison messages ended in the broker's dead-letter list (`tests.chaos.checker`).
The seed fixes every choice (the workload's prompts and pauses, the nemesis's faults,
victims and gaps, the model's delays); the machine's timing does not repeat exactly.

`--cluster` puts the store on a Redis Cluster of its own (3 primaries, each with a
replica) with `FX_ACK=replica`; the AOF server stays, as the Celery broker alone (where
the tools also record their starts and diagnostics). The nemesis then also has the fault
`primary`: kill -9 the primary of an active session's keys, wait for its replica to take
over, restart the node and wait until it is an online replica again. Its `redis` restart,
`clients` (CLIENT KILL) and `squeeze` (maxmemory) faults act on the broker, not on the
cluster. Every store read of the run (the checker's streams, the nemesis's leases and
epochs, the API key scan of each primary) goes to the cluster; queues, dead letters and
the tools' records are read from the broker. The invariants are the same.

`--plant duplicate-effects` starts the workers with `FX_TEST_DUPLICATE_EFFECTS=1`, which
makes the chaos agents' non-idempotent `effect` tool start every call twice
(tests/chaos/tooling.py): the checker must then fail (§11.2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from fxworker.keys import queue_name, session_keys
from tests.chaos.approvals import Approver
from tests.chaos.callers import Callers
from tests.chaos.checker import Observation, Verdict, check, children_of, fault_kinds
from tests.chaos.history import History
from tests.chaos.nemesis import CLUSTER_KINDS, KINDS, Nemesis
from tests.chaos.system import System
from tests.chaos.tooling import events_key, runs_key
from tests.chaos.wakes import Valve, WakeSampler
from tests.chaos.workload import Driver, ModelScript, SessionDriver
from tests.support.stored import unpacked

RESULTS = Path(__file__).resolve().parent / "results"
PLANTS = {"duplicate-effects": {"FX_TEST_DUPLICATE_EFFECTS": "1"}}
DRAIN_POLL_S = 0.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=90.0, help="seconds of workload and faults (default 90)")
    p.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a random one, printed)")
    p.add_argument("--sessions", type=int, default=10, help="concurrent sessions (default 10)")
    p.add_argument("--prompts", type=int, default=6, help="prompts per session (then its driver starts a new one; default 6)")
    p.add_argument("--workers", type=int, default=3, help="Celery worker processes kept alive (default 3)")
    p.add_argument("--drain", type=float, default=150.0, help="seconds to let acknowledged inputs finish")
    p.add_argument("--gap", type=float, nargs=2, default=(2.5, 5.0), metavar=("MIN", "MAX"),
                   help="seconds between two faults (default 2.5 5)")
    p.add_argument("--no-faults", action="store_true", help="run the workload without the nemesis")
    p.add_argument("--no-callers", action="store_true",
                   help="no caller actions (early cancels, steer and cancel storms, sessions of the agent no worker runs)")
    p.add_argument("--cluster", action="store_true",
                   help="the store on a Redis Cluster (3 primaries + 3 replicas, FX_ACK=replica), the AOF "
                        "Redis as the broker; adds the fault kind primary")
    p.add_argument("--faults", type=_kinds, default=None, metavar="KIND,...",
                   help=f"the fault kinds of the schedule (default all: {','.join(KINDS)}; "
                        "with --cluster also primary)")
    p.add_argument("--no-slow", action="store_true",
                   help="no session opens with the call every delivery cuts off (shorter, but §11.6 goes unexercised)")
    p.add_argument("--plant", choices=sorted(PLANTS), default=None, help="plant a fault the checker must catch")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"where the JSON goes (default {RESULTS})")
    args = p.parse_args(argv)
    allowed = CLUSTER_KINDS if args.cluster else KINDS
    if args.faults is None:
        args.faults = allowed
    elif not set(args.faults) <= set(allowed):
        p.error(f"--faults {','.join(sorted(set(args.faults) - set(allowed)))}: only with --cluster")
    return args


def _kinds(value: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    unknown = sorted(set(kinds) - set(CLUSTER_KINDS))
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown fault kind(s) {unknown}: choose from {','.join(CLUSTER_KINDS)}")
    return kinds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else int(uuid.uuid4().int % 1_000_000)
    started = time.monotonic()
    verdict, obs, history = run(args, seed)
    elapsed = time.monotonic() - started
    print(table(verdict, seed, elapsed, cluster=args.cluster))
    path = write_results(args, seed, verdict, obs, history, elapsed)
    print(f"results: {path}")
    if verdict.passed:
        print(f"chaos: passed (seed {seed})")
        return 0
    for v in verdict.violations[:50]:
        print(f"VIOLATION {v}")
    if len(verdict.violations) > 50:
        print(f"... and {len(verdict.violations) - 50} more (see {path})")
    print(f"chaos: FAILED with {len(verdict.violations)} violation(s); replay with --seed {seed} "
          f"(make chaos SEED={seed} DURATION={args.duration:g})")
    return 1


def run(args: argparse.Namespace, seed: int) -> tuple[Verdict, Observation, History]:
    history = History()
    api_key = f"sk-chaos-{uuid.uuid4().hex}"
    script = ModelScript(seed, api_key, history)
    system = System(workers=args.workers, prefix=f"fxc{seed}", api_key=api_key, responder=script,
                    worker_env=PLANTS.get(args.plant or "", {}), cluster=args.cluster)
    try:
        system.start()
        history.record("started", workers=args.workers, sessions=args.sessions, seed=seed, plant=args.plant,
                       cluster=args.cluster)
        assert system.web is not None
        stop_at = time.monotonic() + args.duration
        drivers = [Driver(i, system.web.url, seed, history, stop_at, prompts=args.prompts,
                          first_prompt="slow" if i == 0 and not args.no_slow else None) for i in range(args.sessions)]
        tags: dict[str, str] = {}
        nemesis = None
        valve = Valve(system, system.broker_key(queue_name("late")), system.broker_key(queue_name("default")))
        valve.mark_live()
        valve.start()
        sampler = WakeSampler(system, history).start()
        if not args.no_faults:
            nemesis = Nemesis(system, script, tags, seed=seed, history=history, stop_at=stop_at,
                              gap_s=tuple(args.gap), kinds=args.faults).start()  # type: ignore[arg-type]
        callers = None
        if not args.no_callers:
            callers = Callers(system.web.url, seed, history, stop_at, drivers=drivers, valve=valve).start()
        assert system.web2 is not None
        approver = Approver((system.web.url, system.web2.url), seed, history,
                            lambda: _sessions(drivers) + (list(callers.sessions) if callers is not None else [])).start()
        for d in drivers:
            d.start()
            time.sleep(0.1)
        while time.monotonic() < stop_at:
            tags.update({s.tag: s.session_id for s in _sessions(drivers) if s.session_id})
            time.sleep(0.2)
        for d in drivers:
            d.thread.join(60)
        if nemesis is not None:
            nemesis.stop()
        if callers is not None:
            callers.stop()
        sessions = _sessions(drivers) + (callers.sessions if callers is not None else [])
        history.record("faults_stopped")
        assert system.pool is not None
        system.pool.fill()
        drained = drain(system, sessions, args.drain)
        history.record("drained", complete=drained)
        approver.stop()
        if callers is not None:
            callers.join_watchers()
        for s in sessions:
            if s.reader is not None:
                s.reader.finish()
        for s in sessions:
            if s.reader is not None:
                s.reader.thread.join(30)
        sampler.stop()
        sampler.final()
        valve.stop()
        obs = observe(system, sessions, history, seed, script)
        verdict = check(obs)
        verdict.figures["faults_not_applied"] = len(history.of("fault_failed"))
        return verdict, obs, history
    finally:
        system.close()


def _sessions(drivers: list[Driver]) -> list[SessionDriver]:
    return [s for d in drivers for s in list(d.sessions)]


def drain(system: System, drivers: list[SessionDriver], timeout_s: float) -> bool:
    """Waits until every acknowledged prompt of every session has its `turn_end` stored, and
    the turn of every child session their delegated calls started (`children`) too: a
    parent whose child still runs has not ended, and a child of a cancelled parent may
    end after it."""
    deadline = time.monotonic() + timeout_s
    ended: set[str] = set()  # child sessions seen ended (a child has one turn)
    while time.monotonic() < deadline:
        if all(_finished(system, d) for d in drivers) and _children_finished(system, drivers, ended):
            return True
        time.sleep(DRAIN_POLL_S)
    return False


def children(system: System, session_ids: list[str]) -> dict[str, str]:
    """Child session id -> its turn's message id, of every delegated call the sessions'
    stored lines name, and their children's, and so on."""
    found: dict[str, str] = {}
    parents = list(session_ids)
    while parents:
        named = children_of({s: system.lines(s) for s in parents})
        parents = [c for c in named if c not in found]
        found.update(named)
    return found


def _children_finished(system: System, drivers: list[SessionDriver], ended: set[str]) -> bool:
    for child, message_id in children(system, [d.session_id for d in drivers if d.session_id]).items():
        if child in ended:
            continue
        if not any(ln["type"] == "turn_end" and ln.get("messageId") == message_id for ln in system.lines(child)):
            return False
        if system.retrying(lambda r, c=child: r.zcard(_pending_key(system, c))) != 0:
            return False
        ended.add(child)
    return True


def _finished(system: System, driver: SessionDriver) -> bool:
    if driver.session_id is None:
        return True
    if driver.wait_until is not None and time.monotonic() > driver.wait_until:
        return True  # a ghost session's inputs had their time (the checker says whether they ended)
    want = {a["messageId"] for a in driver.acked if a["input"] == "prompt"}
    ended = {ln.get("messageId") for ln in system.lines(driver.session_id) if ln["type"] == "turn_end"}
    waiting = system.retrying(lambda r: r.zcard(_pending_key(system, driver.session_id)))
    return want <= ended and waiting == 0


def _pending_key(system: System, session_id: str | None) -> str:
    assert session_id is not None
    return session_keys(system.prefix, session_id).pending


def observe(system: System, drivers: list[SessionDriver], history: History, seed: int,
            script: ModelScript) -> Observation:
    """Reads what the store holds and gathers what the run recorded."""
    sessions = [d.session_id for d in drivers if d.session_id]
    # The tools record on REDIS_URL: the broker (on a standalone store, the same server).
    runs = [json.loads(v) for v in system.entries(runs_key(system.prefix))]
    events = [json.loads(v) for v in system.entries(events_key(system.prefix))]
    readers = {d.session_id: d.reader.seen for d in drivers if d.session_id and d.reader is not None}
    stopped = {f["pid"] for f in history.of("fault") if f["fault"] in ("kill", "term")}
    exits = system.exits(except_pids=stopped)
    for e in exits:
        history.record("worker_exit", **e)
    return Observation(
        seed=seed,
        acks=history.of("ack"),
        streams={s: system.lines(s) for s in sessions},
        readers=readers,  # type: ignore[arg-type]
        runs=runs,
        events=events,
        faults=history.of("fault"),
        recoveries=history.of("recovery"),
        unacked=history.of("unacked"),
        refused=history.of("refused"),
        key_hits=key_hits(system),
        keyed_requests=script.keyed_requests,
        reader_connections=sum(d.reader.connections for d in drivers if d.reader is not None),
        worker_exits=exits,
        dead_letters=[_text(v) for v in system.entries(system.dead_letter_key())],
        queued=[_text(v) for key in system.queue_keys() for v in system.entries(key)],
        retried=history.of("retried"),
        stalls=history.of("stalled"),
        cluster=system.cluster is not None,
        epochs={s: system.epoch(s) for s in sessions},
        ended_at={d.session_id: d.reader.last_end_t for d in drivers
                  if d.session_id and d.reader is not None and d.reader.last_end_t is not None},
        callers=history.of("caller", "caller_failed", "storm", "ghost", "cancel"),
        wakes=history.of("wakes", "wakes_final"),
        drained_t=next((op["t"] for op in history.of("drained")), None),
        decisions=history.of("decision"),
        children={c: system.lines(c) for c in children(system, sessions)},
        typed_answers=history.of("typed_answer"),
    )


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="backslashreplace")


def key_hits(system: System) -> list[str]:
    """Where the API key is found: any Redis key name or value of any type (on the broker
    and each cluster primary), or the servers' files (the AOF)."""
    needle = system.api_key.encode()

    def scan(r: Any) -> list[str]:
        hits = []
        for key in r.scan_iter(count=1000):
            if needle in key or any(needle in v for v in _values(r, key)):
                hits.append(key.decode(errors="replace"))
        return hits

    hits = system.each_server(scan)
    for directory in system.data_dirs():
        for path in directory.rglob("*"):
            if path.is_file() and needle in path.read_bytes():
                hits.append(f"file {path.name}")
    return hits


def _values(r: Any, key: bytes) -> list[bytes]:
    kind = r.type(key)
    if kind == b"string":
        return [r.get(key) or b""]
    if kind == b"hash":  # a checkpoint packed at rest is read unpacked
        return [b for f, v in r.hgetall(key).items() for b in (f, unpacked(key, f, v))]
    if kind == b"list":
        return list(r.lrange(key, 0, -1))
    if kind == b"set":
        return list(r.smembers(key))
    if kind == b"zset":
        return list(r.zrange(key, 0, -1))
    if kind == b"stream":  # and lines packed at rest expanded
        return [b for _, fields in r.xrange(key) for f, v in fields.items() for b in (f, unpacked(key, f, v))]
    return []


# ----------------------------------------------------------------------------- output


def _s(value: Any) -> str:
    return "-" if value is None else f"{value:.2f} s"


def table(verdict: Verdict, seed: int, elapsed_s: float, *, cluster: bool = False) -> str:
    f = verdict.figures
    faults = f["faults"]
    failovers = [("primaries killed: failover p50 / max; rejoined p50 / max",
                  f"{f['primaries_killed']}: {_s(f['failover_p50_s'])} / {_s(f['failover_max_s'])}; "
                  f"{_s(f['rejoin_p50_s'])} / {_s(f['rejoin_max_s'])}"),
                 ("failovers forced back (flaps): max", f"{f['failed_back']}: {_s(f['failback_max_s'])}")] if cluster else []
    rows = [
        ("seed", seed),
        ("wall time", f"{elapsed_s:.0f} s"),
        ("sessions", f["sessions"]),
        ("prompts acknowledged", f["prompts"]),
        ("steers acknowledged", f["steers"]),
        ("turns ended", f["turns"]),
        ("stop reasons", ", ".join(f"{k} {v}" for k, v in sorted(f["stop_reasons"].items(), key=str))),
        ("lines stored", f["lines"]),
        *((f"faults: {kind}", faults[kind]) for kind in fault_kinds(cluster)),
        *failovers,
        ("faults not applied", f["faults_not_applied"]),
        ("workers exited unprompted", f["worker_exits"]),
        ("poison messages (dead-lettered) / dead letters",
         f"{f['poison_messages']} ({f['poison_dead_lettered']}) / {f['dead_letters']}"),
        ("OOM replies while squeezed", f["oom_replies"]),
        ("5xx resent (status code: n)", ", ".join(f"{k}: {v}" for k, v in sorted(f["retried"].items())) or "-"),
        ("model streams stalled / idle timeouts (retried) / turns ended by one",
         f"{f['stalled_requests']} / {f['model_timeouts']} ({f['model_timeouts_retried']}) / {f['provider_timeouts']}"),
        ("takeovers", f["takeovers"]),
        ("fenced writers", f["fenced"]),
        ("yields", f["yields"]),
        ("resumes", f["resumes"]),
        ("deadline cut-offs (max in a row)", f"{f['cutoffs']} ({f['max_cutoffs_in_a_row']})"),
        ("effect calls / probe calls", f"{f['effect_calls']} / {f['probe_calls']}"),
        ("idempotent reruns", f["probe_reruns"]),
        ("reader lines checked (connections)", f"{f['reader_lines']} ({f['reader_connections']})"),
        ("lost", f["lost"] + f["lost_steers"]),
        ("duplicated effects", f["duplicated_effects"]),
        ("starts without intent", f["starts_without_intent"]),
        ("stale lines", f["stale_lines"]),
        ("API key found in Redis", f["key_found"]),
        ("caller actions", ", ".join(f"{k} {v}" for k, v in sorted(f["caller_actions"].items())) or "-"),
        ("cancels before any claim (valve held / raced of n)",
         f"{f.get('cancels_before_claim', 0)} ({f.get('cancels_before_claim_held', 0)} / "
         f"{f.get('cancels_before_claim', 0) - f.get('cancels_before_claim_held', 0)} of "
         f"{f.get('cancels_early_raced', 0)})"),
        ("storms sent (steers and cancels) / cancels", f"{f.get('storms', 0)} ({f.get('storm_inputs', 0)}) / "
                                                       f"{f.get('cancels', 0)}"),
        ("ghost sessions: noWorker shown / inputs ended FX_NO_AGENT",
         f"{f['ghost_sessions']}: {f['ghost_no_worker_shown']} / {f['ghost_inputs_ended_no_agent']}"),
        ("refund calls parked: decided (approved / denied) / started",
         f"{f['refund_calls']}: {f['refund_calls_decided']} ({f['refund_calls_approved']} / "
         f"{f['refund_calls_denied']}) / {f['refund_calls_started']} ({f['refund_starts']} starts)"),
        ("decisions sent: accepted / 202 repeated / 409 by code / unanswered",
         f"{f['decisions_sent']}: {f['decisions_accepted']} / {f['decisions_repeated_202']} / "
         f"{', '.join(f'{k} {v}' for k, v in sorted(f['decisions_refused'].items())) or '-'} / "
         f"{f['decisions_unanswered']}"),
        ("decision modes (calls)", ", ".join(f"{k} {v}" for k, v in sorted(f["decision_modes"].items())) or "-"),
        ("decisions sent within 2 s of a kill / stop / term", f["decisions_near_faults"]),
        ("parked turns decided / ended undecided (cancelled)",
         f"{f['parked_turns_decided']} / {f['parked_turns_ended_undecided']}"),
        ("delegated calls: delegate_start / answers by stop reason",
         f"{f['delegated_calls']}: {f['delegate_starts']} / "
         f"{', '.join(f'{k} {v}' for k, v in sorted(f['delegate_answers'].items())) or '-'}"),
        ("delegating turns ended by stop reason",
         ", ".join(f"{k} {v}" for k, v in sorted(f["delegating_turns"].items())) or "-"),
        ("child sessions: ended by stop reason",
         f"{f['child_sessions']}: {', '.join(f'{k} {v}' for k, v in sorted(f['children_ended'].items())) or '-'}"),
        ("child effect calls / probe calls", f"{f['child_effect_calls']} / {f['child_probe_calls']}"),
        ("delegating turns cancelled (status when sent -> end; children)",
         ", ".join(f"{k} {v}" for k, v in sorted(f["cancels_of_delegating_turns"].items())) or "-"),
        ("typed sessions: turns ended by stop reason (steered)",
         f"{f['typed_sessions']}: {', '.join(f'{k} {v}' for k, v in sorted(f['typed_ended'].items())) or '-'} "
         f"({f['typed_steered_turns']})"),
        ("typed answers given: valid / invalid (retries asked) / refused stored",
         f"{f['typed_answers_valid']} / {f['typed_answers_invalid']} ({f['typed_retries_asked']}) / "
         f"{f['typed_refused_stored']}"),
        ("typed outputs checked / probes answered not run / most requests of a turn",
         f"{f['typed_outputs']} / {f['typed_probes_not_run']} / {f['typed_requests_max']}"),
        ("typed kills armed / fired (after an invalid answer)", f"{faults['typed']} / {f['typed_kills']}"),
        ("inputs ended twice", f["ended_twice"]),
        ("epochs (highest share of a session's bound)", f"{f['epochs']} ({f['epoch_of_bound_max']:.2f})"),
        ("lines / epoch / yield bounds exceeded", f["bounds_exceeded"]),
        ("wakes queued for one session: max (sessions over 1) / left after drain",
         f"{f['wakes_queued_max']} ({f['sessions_over_wake_bound']}) / {f['wakes_left_queued']}"),
        *((f"recover after {name}: p50 / p99 / max (n)",
           f"{_s(f[f'recover_{k}_p50_s'])} / {_s(f[f'recover_{k}_p99_s'])} / {_s(f[f'recover_{k}_max_s'])} "
           f"({f[f'recover_{k}_n']})") for k, name in (("kill", "kill -9"), ("stop", "SIGSTOP"))),
        ("violations", len(verdict.violations)),
    ]
    width = max(len(str(k)) for k, _ in rows)
    return "\n".join(f"{str(k).ljust(width)}  {v}" for k, v in rows)


def write_results(args: argparse.Namespace, seed: int, verdict: Verdict, obs: Observation, history: History,
                  elapsed_s: float) -> Path:
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"chaos-{seed}{'-' + args.plant if args.plant else ''}.json"
    body = {
        "seed": seed,
        "passed": verdict.passed,
        "elapsed_s": round(elapsed_s, 1),
        "settings": {"duration_s": args.duration, "sessions": args.sessions, "prompts": args.prompts,
                     "workers": args.workers, "gap_s": list(args.gap),
                     "faults": [] if args.no_faults else list(args.faults), "slow": not args.no_slow,
                     "plant": args.plant, "cluster": args.cluster},
        "figures": verdict.figures,
        "violations": verdict.violations,
    }
    path.write_text(json.dumps(body, indent=2, default=str) + "\n")
    history.write_jsonl(path.with_suffix(".history.jsonl"))
    store = {"streams": obs.streams, "children": obs.children, "runs": obs.runs, "events": obs.events, "dead_letters": obs.dead_letters,
             "queued": obs.queued, "epochs": obs.epochs, "ended_at": obs.ended_at}
    path.with_suffix(".store.json").write_text(json.dumps(store, default=str) + "\n")
    return path


if __name__ == "__main__":
    sys.exit(main())
