"""Chat with a trained checkpoint on the CPU: ``python -m atom_train.chat``.

The model runs with the single-stream reference (float32, one CPU thread), one byte at a
time; the reply is printed as it is sampled, one whole character at a time.

Examples::

    # one reply to a prompt (a continuation of the text), then exit
    python -m atom_train.chat --checkpoint runs/fr/ckpt-final.safetensors --prompt "Bonjour"
    # a run folder means its newest valid checkpoint; interactive chat on a terminal
    python -m atom_train.chat --checkpoint runs/fr
    # reproducible: the same checkpoint, prompt, flags and seed give the same reply
    python -m atom_train.chat --checkpoint runs/fr --prompt "Il était" --seed 7 --temperature 0.6
    # interactive mode reads lines from a pipe too: one reply line per input line
    printf 'Bonjour\\nÇa va ?\\n' | python -m atom_train.chat --checkpoint runs/fr --seed 1

Interactive mode is one continuous text: each line you type is fed followed by a newline,
then the reply is sampled until it writes a newline (or --max-bytes), and the next turn goes
on from there, so the model sees the whole conversation (until an episode reset, every
``episode_length`` bytes, clears its state as in training). Newlines the model writes before
any text (a corpus built by ``python -m atom_train.corpus`` puts a blank line after every
document, so a line is often followed by another newline) are fed but are not the reply: a
reply is the next line of text. ``/quit`` or end of input leaves.

Exit status: 0 = done; 2 = a user error (bad flag, missing or corrupt checkpoint, a
checkpoint whose features this code does not compute), with one line on stderr saying why;
130 = interrupted.
"""

from __future__ import annotations

import argparse
import codecs
import math
import secrets
import sys
from collections.abc import Iterable, Iterator
from typing import IO

import torch

from atom_train.common.cli import (
    ArgumentParser,
    UserError,
    add_shared,
    reader_went_away,
    say,
    set_command,
    user_error_exit,
    warn,
)
from atom_train.model.sampling import Sampler
from atom_train.trainer.checkpoint_file import CheckpointError
from atom_train.trainer.train_state import load_model

PROG = "python -m atom_train.chat"
QUIT = b"/quit"
STOP_RULES = ("newline", "none")


# ---- loading ---------------------------------------------------------------------------------

# The checkpoint's content has one owner (atom_train.trainer.train_state); chat reads it from there.
__all__ = ["Printer", "Utf8Streamer", "describe", "displayable", "load_model", "main"]


def describe(meta: dict) -> str:
    """One line about a loaded checkpoint: file, kind, tick, device, features."""
    tr = meta.get("training")
    tr = tr if isinstance(tr, dict) else {}
    prov = meta["provenance"]
    parts = [str(meta.get("kind", "?"))]
    if "tick" in tr:
        parts.append(f"tick {tr['tick']}")
    if isinstance(tr.get("bytes_seen"), int):
        parts.append(f"{tr['bytes_seen']:,} bytes seen")
    if "device" in tr:
        parts.append(f"trained on {tr['device']}")
    parts.append(f"features {prov['pack_mode']} v{prov['feature_version']}")
    return f"{meta['path']} ({', '.join(parts)})"


# ---- printing --------------------------------------------------------------------------------

# What a terminal must not receive raw: C0 controls other than tab and newline (ESC starts
# escape sequences, CR overwrites the line) are shown as their Unicode control pictures, DEL
# as U+2421, C1 controls as U+FFFD. The model still sees the bytes it sampled.
_DISPLAY = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)}
_DISPLAY[0x7F] = 0x2421
_DISPLAY.update({c: 0xFFFD for c in range(0x80, 0xA0)})


def displayable(text: str) -> str:
    """`text` with control characters made visible (see _DISPLAY)."""
    return text.translate(_DISPLAY)


class Utf8Streamer:
    """Bytes in, whole characters out: an incremental UTF-8 decoder with errors="replace".

    `push(b)` returns the characters that byte completes ("" while a multi-byte character is
    still incomplete); an invalid byte or a broken sequence becomes U+FFFD. `flush()` ends the
    text: an incomplete character left at the end becomes U+FFFD.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, b: int) -> str:
        return self._decoder.decode(bytes((b,)))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)  # also resets the decoder


class Printer:
    """Writes sampled bytes to a text stream as whole characters, flushed as they complete.

    Works whatever the stream's encoding: characters it cannot encode are written as its
    replacement ("?"), never as an exception. Only complete characters are ever written.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self._utf8 = Utf8Streamer()
        self._binary = getattr(stream, "buffer", None)
        encoding = getattr(stream, "encoding", None) or "utf-8"
        self._encoder = codecs.getincrementalencoder(encoding)(errors="replace")
        self.at_line_start = True

    def write(self, text: str) -> None:
        if not text:
            return
        if self._binary is not None:
            self.stream.flush()  # anything already written through the text layer goes first
            self._binary.write(self._encoder.encode(text))
            self._binary.flush()
        else:
            self.stream.write(text)
            self.stream.flush()
        self.at_line_start = text.endswith("\n")

    def push(self, b: int) -> None:
        """One sampled byte."""
        self.write(displayable(self._utf8.push(b)))

    def finish(self) -> None:
        """End of a reply: show an incomplete trailing character as U+FFFD."""
        self.write(displayable(self._utf8.flush()))


LINE_BREAKS = b"\r\n"


def reply_line(sampler: Sampler, max_bytes: int, stop: bytes | None) -> Iterator[int]:
    """An interactive turn's reply: up to `max_bytes` sampled bytes, ending after a `stop`
    byte; line breaks sampled before the first other byte (the blank line between documents
    of a built corpus) are fed to the model but are not part of the reply, and do not end
    it (they count towards `max_bytes`)."""
    started = False
    for b in sampler.sample(max_bytes):  # (each byte is fed before it is yielded)
        if not started and b in LINE_BREAKS:
            continue
        started = True
        yield b
        if stop is not None and b in stop:
            return


def print_reply(printer: Printer, reply: Iterable[int]) -> bytes:
    """Stream the sampled bytes of `reply` to `printer`; return them."""
    out = bytearray()
    for b in reply:
        out.append(b)
        printer.push(b)
    printer.finish()
    return bytes(out)


# ---- the two modes ---------------------------------------------------------------------------


def run_prompt(
    sampler: Sampler, printer: Printer, prompt: bytes, max_bytes: int, stop: bytes | None
) -> bytes:
    """Feed `prompt`, print the continuation (ending the output with a newline); return it."""
    sampler.feed(prompt or b"\n")  # the model needs one byte of input before it can predict
    reply = print_reply(printer, sampler.sample(max_bytes, stop))
    if not printer.at_line_start:
        printer.write("\n")
    return reply


def run_interactive(
    sampler: Sampler,
    printer: Printer,
    lines: IO[bytes],
    max_bytes: int,
    stop: bytes | None,
    prompt_to: IO[str] | None = None,
) -> list[bytes]:
    """The chat loop over `lines` (UTF-8 bytes) until EOF or ``/quit``; return the replies.

    Each non-empty line is fed with a newline; the reply is sampled until a `stop` byte or
    `max_bytes`. A reply cut by `max_bytes` is closed with a newline that the model is also
    fed, so the next turn starts on a new line of the same text. `prompt_to`: where to write
    the "> " prompt (a terminal), or None.
    """
    replies = []
    while True:
        if prompt_to is not None:
            prompt_to.write("> ")
            prompt_to.flush()
        line = lines.readline()
        if not line:
            if prompt_to is not None:
                prompt_to.write("\n")  # end of input (Ctrl-D) after the "> " prompt
            break
        line = line.rstrip(b"\r\n")
        if line.strip() == QUIT:
            break
        if not line.strip():
            continue
        sampler.feed(line + b"\n")
        reply = print_reply(printer, reply_line(sampler, max_bytes, stop))
        if not reply.endswith(b"\n"):
            sampler.feed(b"\n")
            printer.write("\n")
        replies.append(reply)
    return replies


# ---- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    p = ArgumentParser(
        prog=PROG,
        description=doc.split("\n\n")[0],
        epilog="\n\n".join(doc.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        metavar="PATH",
        help="a checkpoint file (rolling, snapshot or final; trained on CPU or CUDA), or a run "
        "folder: its newest valid checkpoint",
    )
    p.add_argument(
        "--prompt",
        metavar="TEXT",
        help="print one reply to TEXT (its continuation) and exit; without it, chat "
        "interactively, reading lines from stdin",
    )
    p.add_argument(
        "--max-bytes",
        type=int,
        default=400,
        metavar="N",
        help="at most N bytes per reply (default: %(default)s)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        metavar="T",
        help="sampling temperature; 0 = always the most likely byte (default: %(default)s)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=40,
        metavar="K",
        help="sample among the K most likely bytes; 0 = all 256 (default: %(default)s)",
    )
    add_shared(
        p,
        "seed",
        type=int,
        metavar="N",
        help="seed of the sampler: the same seed, checkpoint, prompt and flags give the same "
        "reply (default: a random seed, printed on stderr)",
    )
    p.add_argument(
        "--stop",
        choices=STOP_RULES,
        help="end a reply at the first newline it writes, or only at --max-bytes "
        "(default: newline in interactive mode, none with --prompt)",
    )
    return p


def _check_args(args: argparse.Namespace) -> None:
    if args.max_bytes < 1:
        raise UserError(f"--max-bytes must be at least 1, got {args.max_bytes}")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise UserError(f"--temperature must be >= 0 (0 = greedy), got {args.temperature}")
    if args.top_k < 0:
        raise UserError(f"--top-k must be >= 0 (0 = all bytes), got {args.top_k}")
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise UserError(f"--seed must be in [0, 2**63), got {args.seed}")


def _to_utf8(text: str) -> bytes:
    """Command-line text as the UTF-8 bytes the model reads (bytes that were not valid in the
    locale's encoding come back as they were)."""
    try:
        return text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="replace")


class _Utf8Lines:
    """Lines of a binary stream, transcoded to UTF-8 when its declared encoding is another."""

    def __init__(self, stream: IO[str]) -> None:
        self._raw = stream.buffer
        encoding = getattr(stream, "encoding", None) or "utf-8"
        self._encoding = None if codecs.lookup(encoding).name == "utf-8" else encoding

    def readline(self) -> bytes:
        line = self._raw.readline()
        if self._encoding is not None:
            line = line.decode(self._encoding, errors="replace").encode("utf-8")
        return line


def main(argv: list[str] | None = None) -> int:
    set_command("chat")
    try:
        args = build_parser().parse_args(argv)
        _check_args(args)
        model, meta = load_model(args.checkpoint, warn=warn)
    except (UserError, CheckpointError) as e:
        return user_error_exit(e)
    # One thread: one stream of small matrix-vector products gains nothing from more, and the
    # float32 sums then do not depend on the machine's core count.
    torch.set_num_threads(1)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    say(f"{describe(meta)}; seed {seed}")
    sampler = Sampler(model, temperature=args.temperature, top_k=args.top_k, seed=seed)
    printer = Printer(sys.stdout)
    interactive = args.prompt is None
    stop_rule = args.stop or ("newline" if interactive else "none")
    stop = b"\n" if stop_rule == "newline" else None
    try:
        if not interactive:
            run_prompt(sampler, printer, _to_utf8(args.prompt), args.max_bytes, stop)
        else:
            if sys.stdin is None or getattr(sys.stdin, "buffer", None) is None:
                return user_error_exit("no stdin to read from: pass --prompt TEXT")
            tty = sys.stdin.isatty()
            if tty:
                say("type a line and press Enter; /quit or Ctrl-D leaves")
            run_interactive(
                sampler,
                printer,
                _Utf8Lines(sys.stdin),
                args.max_bytes,
                stop,
                prompt_to=sys.stderr if tty else None,
            )
    except KeyboardInterrupt:
        printer.finish()
        if not printer.at_line_start:
            printer.write("\n")
        elif interactive and sys.stdin.isatty():
            sys.stderr.write("\n")  # leave the terminal below the "> " prompt
        return 130
    except BrokenPipeError:
        return reader_went_away()
    return 0


if __name__ == "__main__":
    sys.exit(main())
