"""`voicehub`: the command-line entry point (say, talk, models).

Every failure prints one line that says what to do and exits non-zero; no partial output file is
left behind.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from voicehub.bench import cli_commands as bench_commands
from voicehub.errors import VoiceHubError
from voicehub.models.gpt_sovits import cli_commands as gpt_sovits_commands
from voicehub.server import cli_commands as server_commands

EXIT_ERROR = 2
PROGRESS_MIN_SENTENCES = 4  # a progress bar only for texts longer than a few sentences


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", "-m", default=None, help="installed voice name or path (default: en_US-joe-medium)"
    )
    p.add_argument("--model-type", default=None, help="model family; inferred from the files when omitted")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--voice", default=None, help="speaker of a multi-speaker voice (id or name)")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible audio")
    p.add_argument(
        "--speed", type=float, default=None, help="speaking rate; 1.0 is the voice's own, 1.5 faster"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voicehub", description="Text to speech, streamed as it is made.")
    sub = parser.add_subparsers(dest="command", required=True)

    say = sub.add_parser("say", help="speak a text into a file, stdout or the speakers")
    say.add_argument("text", nargs="?", help="the text to speak (or use -f)")
    say.add_argument("-f", "--file", type=Path, help="read the text from a UTF-8 file ('-' for stdin)")
    say.add_argument("-o", "--output", default=None, help="output file, or '-' for raw PCM on stdout")
    say.add_argument("--format", default=None, help="wav, flac, mp3, ogg, opus, pcm_s16le, pcm_f32le")
    say.add_argument("--play", action="store_true", help="play on the default audio device as audio arrives")
    _add_model_args(say)

    talk = sub.add_parser("talk", help="speak each line typed on stdin")
    talk.add_argument(
        "--out-dir", type=Path, default=None, help="write line-N.wav files here instead of playing"
    )
    _add_model_args(talk)

    sub.add_parser("models", help="list model families and installed voices")
    bench_commands.add_parsers(sub)
    server_commands.add_parsers(sub)
    gpt_sovits_commands.add_parsers(sub)
    return parser


def _load_model(args: argparse.Namespace) -> Any:
    from voicehub.hub import AutoModelForTextToSpeech

    return AutoModelForTextToSpeech.from_pretrained(
        args.model, model_type=args.model_type, device=args.device
    )


def _gen_params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {"voice": args.voice, "seed": args.seed}
    if args.speed is not None:
        params["speed"] = args.speed  # every family takes speed (1.0 = the voice's own rate)
    return params


def _read_text(args: argparse.Namespace) -> str:
    if (args.text is None) == (args.file is None):
        raise ValueError("give the text as an argument or with -f FILE (one of them)")
    if args.file is None:
        return args.text
    if str(args.file) == "-":
        return sys.stdin.read()
    try:
        return args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read text file {str(args.file)!r}: {exc}") from exc


def _with_progress(chunks: Iterator[Any], text: str) -> Iterator[Any]:
    n_sentences = len(re.findall(r"[.!?。！？]+(\s|$)", text))
    if n_sentences < PROGRESS_MIN_SENTENCES or not sys.stderr.isatty():
        yield from chunks
        return
    from tqdm import tqdm

    with tqdm(total=len(text), unit="char", desc="speaking", file=sys.stderr) as bar:
        done = 0
        for chunk in chunks:
            pos = text.find(chunk.text, done)
            if pos >= 0:
                bar.update(pos + len(chunk.text) - done)
                done = pos + len(chunk.text)
            yield chunk


def cmd_say(args: argparse.Namespace) -> None:
    from voicehub.audio.io import AudioFileWriter, AudioFormat, parse_format, to_pcm

    text = _read_text(args)
    if args.output is None and not args.play:
        raise ValueError("say needs -o FILE, -o - (raw PCM on stdout) or --play")
    to_stdout = args.output == "-"
    fmt = parse_format(args.format) if args.format else None
    if to_stdout and fmt is not None and not fmt.is_raw:
        raise ValueError("-o - writes raw PCM; use --format pcm_s16le or pcm_f32le, or write a file")
    model = _load_model(args)
    chunks = _with_progress(model.stream(text, **_gen_params(args)), text)
    with ExitStack() as stack:
        writer = player = None
        if args.output is not None and not to_stdout:
            writer = stack.enter_context(AudioFileWriter(args.output, model.sample_rate, fmt))
        if args.play:
            from voicehub.audio.playback import Player

            player = stack.enter_context(Player(model.sample_rate))
        for chunk in chunks:
            if writer is not None:
                writer.write(chunk.audio)
            if to_stdout:
                sys.stdout.buffer.write(to_pcm(chunk.audio, fmt or AudioFormat.PCM_S16LE))
                sys.stdout.buffer.flush()
            if player is not None:
                player.play(chunk.audio)
    if writer is not None:
        print(f"wrote {args.output} ({model.sample_rate} Hz)", file=sys.stderr)


def cmd_talk(args: argparse.Namespace) -> None:
    from voicehub.audio.io import write_audio

    model = _load_model(args)
    params = _gen_params(args)
    with ExitStack() as stack:
        player = None
        if args.out_dir is None:
            from voicehub.audio.playback import Player

            player = stack.enter_context(Player(model.sample_rate))
        print("type a line and press Enter to hear it; Ctrl-D ends", file=sys.stderr)
        for n, line in enumerate(sys.stdin):
            if not line.strip():
                continue
            if player is None:
                result = model.generate(line, **params)
                path = write_audio(args.out_dir / f"line-{n}.wav", result.audio, result.sample_rate)
                print(f"wrote {path}", file=sys.stderr)
                continue
            for chunk in model.stream(line, **params):
                player.play(chunk.audio)


def cmd_models(args: argparse.Namespace) -> None:
    from voicehub.models.registry import get_family, known_model_types

    for model_type in known_model_types():
        family = get_family(model_type)
        print(f"{model_type}: {family.summary}")
        for name in family.installed():
            print(f"  {name}")


COMMANDS = {"say": cmd_say, "talk": cmd_talk, "models": cmd_models}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command in bench_commands.COMMANDS:
            return bench_commands.run(args)
        if args.command == "make-checkpoint":
            return gpt_sovits_commands.run(args)
        if args.command in ("serve", "voices"):
            server_commands.run(args)
            return 0
        COMMANDS[args.command](args)
    except (VoiceHubError, ValueError, OSError) as exc:
        print(f"voicehub: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
