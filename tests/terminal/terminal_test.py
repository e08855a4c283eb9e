#!/usr/bin/env python3
"""tessera on a real terminal: the live canvas view and chat, driven through tmux in a 60x8 pane.

usage: terminal_test.py live_view|chat TESSERA_BINARY MODEL_DIR

live_view: `generate` with a canvas far taller than the pane redraws in place: every frame is at most
  7 rows (the cursor-up count of each redraw, read from the bytes the pane received), the pane's
  scrollback does not grow (tmux #{history_size}), and a screen taken mid-run shows the clipped canvas
  ("… N lines above/below") over the status line `step S/T · block B/N · R tok/s · ETA E s`.
chat: an empty line does not end the chat; Ctrl-C during an answer stops it ("(answer stopped)") and
  returns to the prompt; Up recalls the last line (no raw `^[[A`); Ctrl-C at the prompt clears the line;
  /help names the keys; another message gets an answer; Ctrl-C twice on an empty line ends the chat with status 0 and the
  terminal back in canonical mode with echo; the lines were saved in $XDG_STATE_HOME/tessera/chat_history.

Standard library only; exits 77 (skipped) without tmux. Every wait polls with a deadline.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77
COLS, ROWS = 60, 8


class Failure(Exception):
    pass


class Pane:
    """A detached tmux server of our own (its own socket) with one COLS x ROWS pane running `command`
    once `start()` is called; everything the pane receives is logged."""

    def __init__(self, command):
        self.dir = tempfile.mkdtemp(prefix="tessera_terminal_")
        self.sock = os.path.join(self.dir, "tmux.sock")
        self.log = os.path.join(self.dir, "pane.log")
        self.go = os.path.join(self.dir, "go")
        conf = os.path.join(self.dir, "tmux.conf")
        with open(conf, "w") as f:
            f.write("set -g status off\nset -g history-limit 20000\nset -g default-terminal screen\n")
        # The shell survives the Ctrl-C sent to the pane's process group (a trap with a command leaves
        # the child's SIGINT at its default), then says how the command ended and how the terminal is.
        script = (f"trap : INT; while [ ! -e {shlex.quote(self.go)} ]; do sleep 0.02; done; {command}; "
                  "echo __EXIT=$?; stty -a | tr ' ;' '\\n\\n' | grep -xE -- '-?(icanon|echo)' | tr '\\n' ' '; "
                  "echo __STTY; sleep 600")
        self.tmux("-f", conf, "new-session", "-d", "-x", str(COLS), "-y", str(ROWS), "-s", "t",
                  "sh", "-c", script)
        self.tmux("pipe-pane", "-t", "t", "-o", f"cat >> {shlex.quote(self.log)}")

    def start(self):
        open(self.go, "w").close()

    def tmux(self, *args):
        r = subprocess.run(["tmux", "-u", "-S", self.sock, *args], capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            raise Failure(f"tmux {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def screen(self):
        """The visible rows."""
        return self.tmux("capture-pane", "-p", "-t", "t")

    def transcript(self):
        """The scrollback and the visible rows, trailing empty rows dropped."""
        return self.tmux("capture-pane", "-p", "-S", "-", "-t", "t").rstrip("\n")

    def history_size(self):
        return int(self.tmux("display-message", "-p", "-t", "t", "#{history_size}").strip())

    def keys(self, *keys):
        self.tmux("send-keys", "-t", "t", *keys)

    def type(self, text):
        self.tmux("send-keys", "-t", "t", "-l", text)

    def received(self):
        with open(self.log, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait(self, what, test, timeout=30):
        """Polls test(transcript) until it holds; fails naming `what` with the transcript."""
        deadline = time.monotonic() + timeout
        while True:
            t = self.transcript()
            if test(t):
                return t
            if time.monotonic() > deadline:
                raise Failure(f"timed out waiting for {what}; the pane:\n{t}")
            time.sleep(0.05)

    def close(self):
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], capture_output=True, timeout=20)
        shutil.rmtree(self.dir, ignore_errors=True)


def check(cond, message, pane):
    if not cond:
        raise Failure(f"{message}; the pane:\n{pane.transcript()}")


def exited(t):
    return "__STTY" in t


def terminal_restored(pane, t):
    m = re.search(r"__EXIT=(\d+)", t)
    check(m is not None and m.group(1) == "0", "the command did not exit with 0", pane)
    stty = t[t.rfind("__EXIT="):]
    check(re.search(r"(?<!-)icanon", stty) and re.search(r"(?<![-\w])echo\b", stty),
          "the terminal was left without canonical mode or echo", pane)


STATUS = re.compile(r"step (\d+)/(\d+) · block (\d+)/(\d+) · [\d.]+ tok/s · ETA [\d.]+ s")


def live_view(binary, model):
    gen = 448  # 448 masks alone are 8 rows of 60: the canvas is always taller than the pane
    # Greedy low-confidence decoding (not the model's defaults, which may change): this prompt's answer
    # runs its whole length.
    cmd = (f"{shlex.quote(binary)} generate -m {shlex.quote(model)} -p 'The old man said' --gen-length {gen} "
           f"--block-length 64 --steps 112 --alg low_confidence --temperature 0 > /dev/null")
    pane = Pane(cmd)
    try:
        pane.start()
        mid_run = None  # a screen taken while the live view was up
        deadline = time.monotonic() + 60
        while True:
            s = pane.screen()
            if exited(s):
                break
            if mid_run is None and STATUS.search(s) and "lines" in s:
                mid_run = s
            if time.monotonic() > deadline:
                raise Failure("generate did not end within 60 s; the pane:\n" + pane.transcript())
            time.sleep(0.03)
        t = pane.transcript()
        terminal_restored(pane, t)
        # Nothing but the statistics line and the shell's lines were written below the frames: the
        # scrollback holds no frame (each of ~112 frames of 7 rows would have pushed rows into it).
        check(pane.history_size() <= 2, f"the scrollback grew to {pane.history_size()} rows", pane)
        data = pane.received()
        ups = [int(n) for n in re.findall(r"\x1b\[(\d+)F", data)]
        check(len(ups) >= 10, f"only {len(ups)} redraws", pane)
        check(max(ups) <= ROWS - 1, f"a frame of {max(ups)} rows in a {ROWS}-row pane", pane)
        check(re.search(r"… \d+ lines? (above|below)", data) is not None, "no clipped-canvas marker", pane)
        plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", data)
        totals = {(m.group(2), m.group(4)) for m in STATUS.finditer(plain)}
        check(totals == {("112", str(gen // 64))}, f"status lines with step / block totals {totals}", pane)
        check(mid_run is not None, "no screen showed the clipped canvas and the status line", pane)
        rows = mid_run.rstrip("\n").split("\n")
        status_row = next(i for i, r in enumerate(rows) if STATUS.search(r))
        check(status_row <= ROWS - 2, f"the status line on row {status_row + 1} of {ROWS}", pane)
        check(all(len(r) <= COLS for r in rows), "a row wider than the pane", pane)
        print("live view: %d frames, at most %d rows, scrollback %d rows; mid-run screen:\n%s"
              % (len(ups) + 1, max(ups), pane.history_size(), mid_run))
    finally:
        pane.close()


def chat(binary, model):
    state = tempfile.mkdtemp(prefix="tessera_state_")
    # Long, slow answers (160 tokens, one per step, greedy low-confidence decoding, which runs this
    # prompt's answer its whole length) so that Ctrl-C lands during one.
    xdg = os.path.join(state, "not", "yet")  # the history's folders are made
    cmd = (f"XDG_STATE_HOME={shlex.quote(xdg)} {shlex.quote(binary)} chat -m {shlex.quote(model)} "
           "--gen-length 160 --steps 160 --block-length 160 --alg low_confidence --temperature 0")
    pane = Pane(cmd)
    prompts = lambda t: len(re.findall(r"^you>", t, re.M))
    last = lambda t: t.rstrip().split("\n")[-1]
    try:
        pane.start()
        pane.wait("the prompt", lambda t: last(t) == "you>")
        pane.keys("Enter")  # an empty line: a new prompt, not the end
        pane.wait("a second prompt after an empty line", lambda t: prompts(t) == 2 and last(t) == "you>")
        check(not exited(pane.transcript()), "an empty line ended the chat", pane)
        pane.type("/help")
        pane.keys("Enter")
        pane.wait("/help with the keys", lambda t: "Up / Down" in t and "Ctrl-C" in t and last(t) == "you>")

        pane.type("The old man said")
        pane.keys("Enter")
        pane.wait("the live view of the answer", lambda t: re.search(r"step \d+/160", t) is not None)
        pane.keys("C-c")
        t = pane.wait("the stopped answer and a new prompt",
                      lambda t: "(answer stopped)" in t and last(t) == "you>")
        check(not exited(t), "Ctrl-C during an answer ended the chat", pane)
        check(not re.search(r"\[\d+ steps ·", t), "the stopped answer printed statistics", pane)

        pane.keys("Up")
        t = pane.wait("the previous line recalled by Up", lambda t: last(t) == "you> The old man said")
        check("^[[A" not in t and "\x1b[A" not in t, "Up printed its escape sequence", pane)
        n = prompts(t)
        pane.keys("C-c")  # clears the line
        t = pane.wait("a fresh prompt after Ctrl-C on a line", lambda t: prompts(t) == n + 1 and last(t) == "you>")
        check(not exited(t), "Ctrl-C at the prompt ended the chat", pane)

        pane.type("Once upon a time")
        pane.keys("Enter")
        t = pane.wait("an answer to the next message",
                      lambda t: re.search(r"\[\d+ steps · \d+ tokens in", t) and last(t) == "you>", timeout=45)
        answer = t[t.rfind("you> Once upon a time"):]
        check(re.search(r"\[\d+ steps · \d+ tokens in", answer) is not None, "no statistics after the answer",
              pane)

        pane.keys("C-c")  # on an empty line: the hint, then a second Ctrl-C ends
        pane.wait("the hint to end", lambda t: "press Ctrl-C again" in t)
        check(not exited(pane.transcript()), "one Ctrl-C on an empty line ended the chat", pane)
        pane.keys("C-c")
        t = pane.wait("the end of the chat", exited, timeout=15)
        terminal_restored(pane, t)

        with open(os.path.join(xdg, "tessera", "chat_history"), encoding="utf-8", errors="replace") as f:
            saved = f.read()
        for line in ("The old man said", "Once upon a time"):
            check(line.replace(" ", "\\040") in saved or line in saved, f"{line!r} not in the history file",
                  pane)
        print("chat: the transcript\n" + t)
    finally:
        pane.close()
        shutil.rmtree(state, ignore_errors=True)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("live_view", "chat"):
        print(__doc__)
        return 2
    if shutil.which("tmux") is None:
        print("SKIPPED: tmux is not installed (Debian: apt-get install tmux)")
        return SKIP
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ["LANG"] = os.environ["LC_ALL"] = "C.UTF-8"
    try:
        {"live_view": live_view, "chat": chat}[sys.argv[1]](os.path.abspath(sys.argv[2]),
                                                          os.path.abspath(sys.argv[3]))
    except Failure as e:
        print("FAILED:", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
