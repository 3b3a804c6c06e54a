# A fake elastic rank (standard library only): it follows its generations on stdin under
# [elastic] protocol = "ringleader" (from its environment otherwise), logs each as
# `gen=G rank=R world=N pid=P`, speaks the protocol's heartbeat and rank stats (and, started
# as a standby joiner, `ringleader-ready`), and exits 0
# once the file DONE_FILE names exists (or when told ringleader-stop).
import json, os, sys, threading, time

pid = os.getpid()
out = threading.Lock()
now = {}
first = threading.Event()


def say(text):
    with out:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def joined(generation, rank, world):
    now.update(gen=generation, rank=rank)
    say(f"gen={generation} rank={rank} world={world} pid={pid}")
    first.set()


def follow():
    for line in sys.stdin:
        line = line.strip()
        if line == "ringleader-stop":
            break
        if line.startswith("ringleader-generation "):
            g = json.loads(line.split(" ", 1)[1])
            joined(g["generation"], g["rank"], len(g["addrs"]))
    say(f"stopped pid={pid}")
    os._exit(0)


if os.environ.get("RINGLEADER_ELASTIC_PROTOCOL") == "ringleader":
    threading.Thread(target=follow, daemon=True).start()
    if os.environ.get("RINGLEADER_STANDBY") == "1":
        # Started ahead of joining: set up, so say so and wait for the first generation.
        say("ringleader-heartbeat computing_ms=0")
        say("ringleader-ready")
else:
    env = os.environ
    joined(int(env["RINGLEADER_GENERATION"]), int(env["RANK"]), int(env["WORLD_SIZE"]))
first.wait(60)
step = 0
while not os.path.exists(os.environ["DONE_FILE"]):
    step += 1
    say("ringleader-heartbeat computing_ms=0")
    if step % 5 == 1:
        say(f"ringleader-rank-stats generation={now['gen']} rank={now['rank']} step={step} compute_ms=1.000 wait_ms=0.100")
    time.sleep(0.2)
say(f"done pid={pid}")
