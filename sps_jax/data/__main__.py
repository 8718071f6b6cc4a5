"""``python -m sps_jax.data`` (``sps-data``): prepare and verify token folders, provision the tokenizer.

  python -m sps_jax.data prepare --source builtin --out data/builtin
  python -m sps_jax.data verify data/builtin
  python -m sps_jax.data provision-tokenizer
  python -m sps_jax.data encode "Hello world"
"""

from __future__ import annotations

import argparse
import sys

from sps_jax import arguments, cli, token_folder, vocab
from sps_jax.data import corpus, tokenizer


_SOURCE_PATH = arguments.input_path("source", arguments.FILE_OR_FOLDER,
                                          "pass a text/JSONL/Parquet file or folder, 'builtin', or 'hf:NAME[:CONFIG]'")


def source(text: str) -> str:
    """argparse type of --source: 'builtin' and hf:NAME pass, a path is held to the rule of every input path."""
    return _SOURCE_PATH(text) if corpus.is_local(text) else text


source.one_path = _SOURCE_PATH.one_path  # several paths after --source are said as a pattern the shell expanded


def build_parser() -> argparse.ArgumentParser:
    parser = arguments.ArgumentParser(prog="python -m sps_jax.data", description=__doc__,
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenise a corpus into train.bin/val.bin + manifest.json")
    p.add_argument("--source", required=True, type=source,
                   help="'builtin', a text/JSONL/Parquet file or folder, or hf:NAME[:CONFIG]")
    p.add_argument("--out", type=arguments.output_path, required=True,
                   help="the token folder to write; one prepared there already from the same source with the same "
                        "settings is kept, another is replaced only with --force, a folder of other files never")
    p.add_argument("--val-fraction", type=arguments.number("a number from 0 to below 1"),
                   default=token_folder.VAL_FRACTION, help="share of the documents held out as val.bin")
    p.add_argument("--text-field", default=None,
                   help=f"JSONL/Parquet/HF field holding the text (default: {corpus.DEFAULT_TEXT_FIELD})")
    p.add_argument("--hf-split", default=None, help=f"split of a hf: source (default: {corpus.DEFAULT_HF_SPLIT})")
    p.add_argument("--max-documents", type=arguments.positive_int, default=None, metavar="N",
                   help="keep the first N non-empty documents (default: all)")
    p.add_argument("--max-tokens", type=arguments.positive_int, default=None, metavar="N",
                   help="keep documents until N tokens (train + val, EOS included) are written (default: all)")
    p.add_argument("--errors", choices=corpus.ERRORS, default=corpus.STRICT,
                   help="bytes that are not UTF-8 in text/JSONL sources: stop (strict, default) or replace with U+FFFD")
    p.add_argument("--force", action="store_true",
                   help="rebuild even if the output is up to date, or replace a folder prepared with other settings")
    p.set_defaults(run=_prepare)
    v = sub.add_parser("verify", help="check a prepared folder's sizes, ids and checksums")
    v.add_argument("dir", type=token_folder.argument, help="a folder written by prepare")
    v.set_defaults(run=_verify)
    t = sub.add_parser("provision-tokenizer", help="fetch and verify the GPT-2 ranks for offline use")
    t.add_argument("--out", type=arguments.output_path, default=None,
                   help=f"the ranks file to write (default: {tokenizer.default_ranks_path()}, "
                        f"${tokenizer.RANKS_VARIABLE} where set); an existing one is kept if it holds GPT-2's ranks, "
                        "else refused")
    t.set_defaults(run=_provision_tokenizer)
    e = sub.add_parser("encode", help="print the GPT-2 ids of a text")
    e.add_argument("text", help="the text to encode")
    e.set_defaults(run=_encode)
    return parser


# prepare and loader are imported where they are used: they are slower to import than --help, --version, an
# argument error and encode need.


def _prepare(args) -> None:
    from sps_jax.data import prepare
    prepare.prepare(args.source, args.out, val_fraction=args.val_fraction, text_field=args.text_field,
                    hf_split=args.hf_split, max_documents=args.max_documents, max_tokens=args.max_tokens,
                    force=args.force, errors=args.errors, log=cli.note)  # progress, as every command's: stderr


def _verify(args) -> None:
    from sps_jax.data import loader
    for split, tokens in loader.verify(args.dir, vocab.VOCAB_SIZE).items():
        print(f"{split}: {tokens:,} tokens ok")


def _provision_tokenizer(args) -> None:
    tokenizer.provision(args.out)


def _encode(args) -> None:
    print(tokenizer.encode(tokenizer.check_text(args.text, "the text")))


@cli.main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
