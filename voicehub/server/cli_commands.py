"""`voicehub serve` and `voicehub voices ...`: parsers and their dispatch, wired in by voicehub/cli.py.

from voicehub.server import cli_commands
cli_commands.add_parsers(sub)            # in _parser()
COMMANDS["serve"] = COMMANDS["voices"] = cli_commands.run
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from voicehub.server.config import ModelSpec, ServerConfig, load_config
from voicehub.voices import GPT_SOVITS_FAMILY


def add_parsers(sub: Any) -> None:
    """Add the `serve` and `voices` subcommands to an argparse subparsers object."""
    serve = sub.add_parser("serve", help="run the HTTP/WebSocket server")
    serve.add_argument("--config", "-c", type=Path, default=None, help="TOML config file")
    serve.add_argument("--host", default=None, help="address to bind (default 127.0.0.1; others need a key)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8000)")
    serve.add_argument("--api-key", default=None, help="require this key (or set VOICEHUB_API_KEY)")
    serve.add_argument("--data-dir", type=Path, default=None, help="where voices are stored")
    serve.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default cpu)")
    serve.add_argument(
        "--model", "-m", default=None, help="serve this model (name or path) as the default voice"
    )
    serve.add_argument("--cors", action="append", default=None, help="allow this browser origin (repeatable)")
    serve.add_argument(
        "--no-batching",
        dest="batching",
        action="store_false",
        default=None,
        help="one GPT-SoVITS stream at a time per model, no batching engine (single-stream latency tests)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    voices = sub.add_parser("voices", help="list, add, show or remove registry voices")
    voices.add_argument("--config", "-c", type=Path, default=None, help="TOML config file (for its data_dir)")
    voices.add_argument("--data-dir", type=Path, default=None, help="the server's data folder")
    vsub = voices.add_subparsers(dest="voices_command", required=True)
    vsub.add_parser("list", help="list voices")
    show = vsub.add_parser("show", help="show one voice as JSON")
    show.add_argument("name")
    remove = vsub.add_parser("remove", help="delete a voice and its audio")
    remove.add_argument("name")
    add = vsub.add_parser("add", help="add a voice (GPT-SoVITS: reference audio, transcript, language)")
    add.add_argument("name")
    add.add_argument(
        "--family",
        default=GPT_SOVITS_FAMILY,
        help=f"model family: its model type (default {GPT_SOVITS_FAMILY})",
    )
    add.add_argument("--audio", type=Path, default=None, help="reference audio file, 3-10 s")
    add.add_argument("--transcript", default="", help="what is said in the reference audio")
    add.add_argument("--language", default="", help="its language: en, zh, ja, ko, yue, auto, ...")
    add.add_argument(
        "--model-file", action="append", default=[], metavar="KEY=PATH", help="e.g. gpt_path=s1.ckpt"
    )
    add.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE", help="default parameter (JSON value)"
    )
    add.add_argument("--replace", action="store_true", help="update the voice if it exists")


def _pairs(items: list[str], what: str, as_json: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} {item!r} must be KEY=VALUE")
        if as_json:
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError:
                out[key] = value  # a bare word is a string
        else:
            out[key] = str(Path(value).expanduser().resolve())
    return out


def _server_config(args: argparse.Namespace) -> ServerConfig:
    config = load_config(
        args.config,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        data_dir=args.data_dir.expanduser() if args.data_dir else None,
        device=args.device,
        cors_origins=tuple(args.cors) if args.cors else None,
        batching=args.batching,
    )
    if args.model:
        from dataclasses import replace

        models = {args.model: ModelSpec(args.model, path=args.model, preload=True), **config.models}
        config = replace(config, models=models, default_voice=args.model)
    return config


def _voices(args: argparse.Namespace) -> None:
    from voicehub.voices import VoiceRegistry

    data_dir = args.data_dir or load_config(args.config).data_dir
    registry = VoiceRegistry(data_dir)
    cmd = args.voices_command
    if cmd == "list":
        for v in registry.list():
            print(f"{v.name}\t{v.family}\t{v.language}\t{v.transcript[:60]}")
    elif cmd == "show":
        print(json.dumps(registry.get(args.name).to_dict(), indent=2, ensure_ascii=False))
    elif cmd == "remove":
        registry.delete(args.name)
        print(f"removed {args.name}", file=sys.stderr)
    elif cmd == "add":
        fields = dict(
            reference_audio=args.audio,
            transcript=args.transcript,
            language=args.language,
            model_files=_pairs(args.model_file, "--model-file", as_json=False),
            params=_pairs(args.param, "--param", as_json=True),
        )
        if args.replace and args.name in registry:
            entry = registry.update(args.name, family=args.family, **fields)
        else:
            entry = registry.add(args.name, args.family, **fields)
        print(f"added {entry.name} ({entry.family}) to {registry.data_dir}", file=sys.stderr)


def run(args: argparse.Namespace) -> None:
    """Dispatch `serve` or `voices`; errors are raised (VoiceHubError / ValueError / OSError) for cli.main."""
    if args.command == "serve":
        from voicehub.server.serve import serve

        serve(_server_config(args), log_level=args.log_level)
    elif args.command == "voices":
        _voices(args)
    else:
        raise ValueError(f"cli_commands.run does not handle {args.command!r}")
