#!/usr/bin/env python3
"""Killed-and-resumed training test for train_charlm (run by CTest, see examples/CMakeLists.txt).

Per dtype (float64, float32, bfloat16): one uninterrupted run saves its checkpoint at the end; then the same
training with --save-every is killed with SIGKILL at several moments and resumed each time from
what is on disk (--load DIR --save DIR), until a run finishes; every checkpoint file of the two
must then be identical, bit for bit. The kills:
  * random ones: a step drawn from a seeded generator, the process killed a random 0-2 ms after it
    reports having reached that step (so the kill lands wherever the run is then: in a step, a
    validation, or a checkpoint write);
  * two during a checkpoint write, made certain by the trainer's test-only hook
    TAPEGRAD_CHARLM_TEST_PAUSE (models/charlm.hpp, charlm_files::test_pause): the save stops and
    says so, and the test kills it there, once with half of DIR.partial's files written ("files")
    and once between the two renames, DIR gone to DIR.previous and DIR.partial not yet DIR
    ("renamed"; the resumed run must then say it resumes from DIR.partial).
The generator is seeded (--seed), so the kill plan is the same every time. No stray process is left
(every child is killed and reaped, whatever happens) and the scratch directory is removed.

    charlm_kill_resume.py --trainer PATH --work DIR [--seed N] -- MODEL OPTIONS...
Exit status 0 when every checkpoint matched, 1 otherwise (with the reason).
"""
import argparse
import filecmp
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import time

STEPS = 400           # the schedule's length: 7 kills in its first third, short enough for seconds per dtype
SAVE_EVERY = 5        # a checkpoint write every 5 steps: random kills land in writes too
RANDOM_KILLS = 5
# The random kills' steps are drawn from the first quarter of the run, after the second checkpoint.
# A step of the small model takes 0.25-0.5 ms, so a run killed a few steps before its end could
# finish before the signal came when the test waited longer than it meant to (a busy machine: seen
# once, a run killed at step 136 of 150 ended with status 0); the last kill now leaves at least 250
# steps, about 75 ms of work, to the run it kills. And the first kill, a random one, must leave a
# complete checkpoint on disk, which the two kills in a write expect to find (DIR beside the
# incomplete DIR.partial, DIR renamed to DIR.previous): a kill reported after step 10 comes after
# the write of step 5 (seen once, a kill at step 3 left no checkpoint and the next kill's
# expectation failed).
RANDOM_KILL_STEPS = range(2 * SAVE_EVERY, STEPS // 4)
PAUSE_TIMEOUT = 30.0  # seconds to wait for the hook's announcement or a step to be reached


class Failure(Exception):
    pass


class Children:
    """Every process started, so that none outlives the test."""

    def __init__(self):
        self.processes = []

    def start(self, command, env=None):
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        self.processes.append(process)
        return process

    def kill_all(self):
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
            if process.stdout:
                process.stdout.close()


def read_until(process, pattern, deadline):
    """Reads the child's output line by line until a line matches `pattern` (returns the match and
    the output so far) or the child exits (returns None and the output)."""
    output = []
    buffer = b""
    fd = process.stdout.fileno()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Failure(f"timed out waiting for /{pattern.pattern}/; output:\n{''.join(output)}")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            output.append(buffer.decode(errors="replace"))
            return None, "".join(output)
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            text = line.decode(errors="replace") + "\n"
            output.append(text)
            match = pattern.search(text)
            if match:
                return match, "".join(output)


def complete(directory):
    return os.path.isfile(os.path.join(directory, "manifest.txt"))


def steps_on_disk(directory):
    """The steps of the checkpoint a resume would read (train_charlm's find_checkpoint order)."""
    for candidate in (directory + ".partial", directory, directory + ".previous"):
        if complete(candidate):
            with open(os.path.join(candidate, "manifest.txt")) as manifest:
                for line in manifest:
                    if line.startswith("steps_done "):
                        return int(line.split()[1]), candidate
    return 0, None


def state_of(directory):
    names = []
    for suffix in ("", ".partial", ".previous"):
        path = directory + suffix
        if os.path.isdir(path):
            names.append(f"{os.path.basename(path)}{'' if complete(path) else ' (incomplete)'}")
    return ", ".join(names) if names else "nothing"


def run_to_end(children, command, env=None):
    process = children.start(command, env)
    output, _ = process.communicate(timeout=120)
    if process.returncode != 0:
        raise Failure(f"{' '.join(command)} failed ({process.returncode}):\n{output.decode(errors='replace')}")
    return output.decode(errors="replace")


def one_dtype(children, trainer, model, dtype, work, generator):
    whole, killed = os.path.join(work, f"whole_{dtype}"), os.path.join(work, f"killed_{dtype}")
    base = [trainer, *model, "--steps", str(STEPS), "--sample-length", "0", "--dtype", dtype]
    started = time.monotonic()
    run_to_end(children, base + ["--save", whole])
    print(f"{dtype}: uninterrupted run of {STEPS} steps, {time.monotonic() - started:.2f} s", flush=True)

    # The kill plan: five random kills and the two in a write, in a fixed, seeded order.
    # The random kills' steps are drawn at once, spread over the run, and taken in order (a step the
    # run has already passed, after a pause kill went further, becomes the next step it reports).
    plan = ["random", "files", "random", "random", "renamed", "random", "random"]
    random_steps = sorted(generator.sample(RANDOM_KILL_STEPS, RANDOM_KILLS))
    kills = 0
    expect_partial = False
    while True:
        on_disk, source = steps_on_disk(killed)
        command = base + ["--save", killed, "--save-every", str(SAVE_EVERY)]
        if source is not None:
            command += ["--load", killed]
        if not plan:  # every kill done: the last run goes to the end
            output = run_to_end(children, command)
            if expect_partial and "resuming from" not in output:
                raise Failure(f"after the kill between the renames, the run did not resume from .partial:\n{output}")
            print(f"{dtype}: final run from step {on_disk} to {STEPS} finished", flush=True)
            break
        kind = plan.pop(0)
        env = None
        if kind == "random":
            target = max(random_steps.pop(0), on_disk + 1)
            pattern = re.compile(rf"^step +(\d+)/{STEPS} ")
            delay = generator.uniform(0.0, 0.002)
        else:
            first = (on_disk // SAVE_EVERY + 1) * SAVE_EVERY
            target = first + SAVE_EVERY * generator.randint(0, 2)
            env = dict(os.environ, TAPEGRAD_CHARLM_TEST_PAUSE=f"{target}:{kind}")
            pattern = re.compile(rf"^charlm test pause: {kind} at step {target}$")
        process = children.start(command, env)
        deadline = time.monotonic() + PAUSE_TIMEOUT
        output = ""
        while True:
            match, more = read_until(process, pattern, deadline)
            output += more
            if match is None:
                raise Failure(f"the run ended before kill {kills + 1} ({kind}, step {target}):\n{output}")
            if kind != "random" or int(match.group(1)) >= target:
                reached = int(match.group(1)) if kind == "random" else target
                break
        if expect_partial and "resuming from" not in output:
            raise Failure(f"after the kill between the renames, the run did not resume from .partial:\n{output}")
        expect_partial = False
        if kind == "random":
            time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        if process.returncode != -signal.SIGKILL:
            raise Failure(f"kill {kills + 1}: the run ended with status {process.returncode}, not by SIGKILL")
        kills += 1
        after, found = steps_on_disk(killed)
        where = (f"{delay * 1000:.2f} ms after reporting step {reached} (drawn: {target})" if kind == "random"
                 else f"in the checkpoint write of step {target}, "
                      + ("half of the files written" if kind == "files" else "between the two renames"))
        print(f"{dtype}: kill {kills} (SIGKILL, run started at step {on_disk}): {where}; on disk: {state_of(killed)}; "
              f"resumes from step {after} ({os.path.basename(found) if found else 'the start'})", flush=True)
        if kind == "files" and (not complete(killed) or complete(killed + ".partial")):
            raise Failure(f"killed half way through a write, expected a complete checkpoint and an incomplete "
                          f".partial; found {state_of(killed)}")
        if kind == "renamed":
            if complete(killed) or not complete(killed + ".partial") or not complete(killed + ".previous"):
                raise Failure(f"killed between the renames, expected complete .partial and .previous and no "
                              f"checkpoint directory; found {state_of(killed)}")
            expect_partial = True

    names = sorted(os.listdir(whole))
    if len(names) < 10:
        raise Failure(f"{dtype}: the uninterrupted run saved only {len(names)} files")
    if sorted(os.listdir(killed)) != names:
        raise Failure(f"{dtype}: the killed run's checkpoint holds {sorted(os.listdir(killed))}, the uninterrupted "
                      f"run's {names}")
    different = [name for name in names
                 if not filecmp.cmp(os.path.join(whole, name), os.path.join(killed, name), shallow=False)]
    if different:
        raise Failure(f"{dtype}: {len(different)} of {len(names)} files differ from the uninterrupted run: "
                      f"{', '.join(different)}")
    leftovers = [name for name in os.listdir(work) if name.endswith((".partial", ".previous"))]
    leftovers += [name for name in os.listdir(killed) if name.endswith(".tmp")]
    if leftovers:
        raise Failure(f"{dtype}: half-written files left behind: {leftovers}")
    print(f"{dtype}: after {kills} kills, {len(names)} checkpoint files identical to the uninterrupted run", flush=True)
    return kills


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", required=True)
    parser.add_argument("--work", required=True, help="scratch directory (created, then removed)")
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("model", nargs=argparse.REMAINDER, help="-- then train_charlm's model options")
    arguments = parser.parse_args()
    model = arguments.model[1:] if arguments.model[:1] == ["--"] else arguments.model
    generator = random.Random(arguments.seed)
    children = Children()
    shutil.rmtree(arguments.work, ignore_errors=True)
    os.makedirs(arguments.work)
    started = time.monotonic()
    try:
        total = sum(one_dtype(children, arguments.trainer, model, dtype, arguments.work, generator)
                    for dtype in ("float64", "float32", "bfloat16"))
    except Failure as failure:
        print(f"FAILED: {failure}", flush=True)
        return 1
    finally:
        children.kill_all()
        shutil.rmtree(arguments.work, ignore_errors=True)
    print(f"killed and resumed: {total} kills (seed {arguments.seed}), every checkpoint bitwise equal to the "
          f"uninterrupted run, float64, float32 and bfloat16; {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
