"""Atomic folder replacement keeps the old folder until the new one is complete; the readers name the file,
the line and the byte that is wrong."""

import errno
import gzip
import os
import re
import stat
import subprocess
import sys
import types

import pytest

from sps_jax import files, folder_swap, locks, path_checks, reading
from sps_jax.cli import UserError
from tests.helpers import flushes_and_renames


def test_replace_folder_swaps_in_a_complete_folder_and_leaves_the_old_one_on_failure(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with folder_swap.replace_folder(str(target)) as building:
            (tmp_path / "out.partial" / "new.txt").write_text("half")
            assert building == str(tmp_path / "out.partial")
            raise RuntimeError("the source failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no partial folder left behind
    assert [p.name for p in target.iterdir()] == ["old.txt"] and (target / "old.txt").read_text() == "old"
    with folder_swap.replace_folder(str(target)) as building:
        (tmp_path / "out.partial" / "new.txt").write_text("new")
        assert (target / "old.txt").exists(), "the old folder stays until the new one is complete"
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_earlier_files_that_cannot_be_deleted_after_a_replacement_are_said(tmp_path, monkeypatch, capsys):
    # An immutable file left OUT.<random>.old/ beside the new folder without a word.
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    monkeypatch.setattr(folder_swap.shutil, "rmtree", lambda path, ignore_errors=False: None)  # as chattr +i leaves it
    with folder_swap.replace_folder(str(target)):
        (tmp_path / "out.partial" / "new.txt").write_text("new")
    [old] = [p for p in tmp_path.iterdir() if p.name.endswith(".old")]
    assert (old / "earlier" / "old.txt").read_text() == "old" and [p.name for p in target.iterdir()] == ["new.txt"]
    assert capsys.readouterr().err == (f"warning: {target} was replaced, but its earlier files could not all be "
                                       f"deleted: they are in {old}; delete it yourself.\n")


def test_a_folder_that_cannot_be_moved_aside_at_the_swap_leaves_no_aside_folder(tmp_path):
    # Replaced by a file while the new folder was built, the old folder could not be renamed onto the empty
    # OUT.<random>.old folder made for it, which was left beside it.
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(OSError):
        with folder_swap.replace_folder(str(target)):
            target.rmdir()
            target.write_text("a file now")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and target.read_text() == "a file now"


def test_two_writers_of_one_file_at_once_each_rename_a_whole_file(tmp_path):
    # Two first runs provisioning the tokenizer, say: the one that finishes last wins, neither fails.
    path = tmp_path / "out.txt"
    with files.atomic_open(str(path)) as outer:
        outer.write("outer, started first")
        files.write_text(str(path), "inner")
        assert path.read_text() == "inner"
    assert path.read_text() == "outer, started first"
    assert not list(tmp_path.glob("*.partial"))


def test_a_compressed_or_binary_file_read_as_text_is_named_as_such(tmp_path):
    # Both were "is not UTF-8 text: byte 1 is 0x8b: save it as UTF-8", advice that cannot turn a gzip'd prompts
    # file, a checkpoint or a token file into the text meant.
    packed = tmp_path / "prompts.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"prompt": "hi"}\n'))
    with pytest.raises(UserError) as refusal:
        list(reading.read_jsonl(str(packed)))
    assert str(refusal.value) == f"{packed} is compressed, not text: decompress it and pass the file it holds."
    tokens = tmp_path / "val.bin"
    tokens.write_bytes(bytes([0x10, 0x00, 0xc6, 0x01]))
    with pytest.raises(UserError) as refusal:
        reading.read_text(str(tokens), hint=": fix the file")
    assert str(refusal.value) == (f"{tokens} is binary data, not text (it holds NUL bytes; byte 2 is 0xc6): pass a "
                                  "UTF-8 text file.")


def test_readers_name_the_file_line_and_byte(tmp_path):
    bad_json = tmp_path / "a.json"
    bad_json.write_text('{"a": 1,\n "b": }\n')
    with pytest.raises(UserError, match=r"a\.json is not JSON at line 2, column 7"):
        reading.read_json(str(bad_json))
    latin = tmp_path / "b.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(UserError, match=r"b\.txt is not UTF-8 text: byte 3 is 0xe9; try this"):
        reading.read_text(str(latin), hint="; try this")
    assert reading.read_text(str(latin), errors="replace") == "caf\ufffd"
    lines = tmp_path / "c.jsonl"
    lines.write_bytes(b'{"x": 1}\n\n{"x": 2}\n' + b'{"x": \xff}\n{"x": 3}\n')
    with pytest.raises(UserError, match=r"c\.jsonl line 4 is not UTF-8 text: byte 25 is 0xff: save it as UTF-8\.$"):
        list(reading.read_jsonl(str(lines)))
    # A file saved as UTF-16 (Notepad's "Unicode") is named as such.
    utf16 = tmp_path / "d.txt"
    utf16.write_bytes("hi\n".encode("utf-16"))
    with pytest.raises(UserError, match=r"d\.txt is not UTF-8 text: byte 0 is 0x(ff|fe) \(it opens with a UTF-16 "
                                        r"byte-order mark\): save it as UTF-8\.$"):
        reading.read_text(str(utf16))
    lines.write_bytes(b'{"x": 1}\nnot json\n{"x": 3}\n')
    with pytest.raises(UserError, match=r"c\.jsonl is not JSON at line 2, column 1"):
        list(reading.read_jsonl(str(lines)))
    # A pretty-printed JSON document is valid JSON but not JSON Lines: the sentence says which is wanted.
    lines.write_text('{\n  "x": 1\n}\n')
    with pytest.raises(UserError, match=r"c\.jsonl is not JSON at line 1, column 1 .*one JSON value per line"):
        list(reading.read_jsonl(str(lines)))
    # A byte-order mark (Windows editors write one) is not text: it must not join the first prompt or document,
    # and JSON would refuse it.
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b'\xef\xbb\xbf{"x": 1}\r\n{"x": "\xef\xbb\xbf"}\r\n')
    assert list(reading.read_jsonl(str(bom))) == [(1, {"x": 1}), (2, {"x": "\ufeff"})]  # only the file's first
    bom.write_bytes(b"\xef\xbb\xbfcaf\xc3\xa9")
    assert reading.read_text(str(bom)) == "caf\u00e9"
    bom.write_bytes(b"\xef\xbb\xbfcaf\xe9")
    with pytest.raises(UserError, match="byte 6 is 0xe9"):  # counted in the file, mark included
        reading.read_text(str(bom))
    # A writer killed mid-line leaves a partial last line, which a tolerant reader drops.
    lines.write_bytes(b'{"x": 1}\n{"x": 2}\n{"x": ')
    assert list(reading.read_jsonl(str(lines), drop_partial_last=True)) == [(1, {"x": 1}), (2, {"x": 2})]
    with pytest.raises(UserError, match=r"c\.jsonl is not JSON at line 3, column 7 \(Expecting value\): it is read as "
                                        r"JSON Lines, one JSON value per line\.$"):
        list(reading.read_jsonl(str(lines)))


@pytest.mark.parametrize("out", ["", "  ", ".", "..", "WORK", "PARENT"])
def test_a_folder_swap_never_takes_the_working_directory_or_a_folder_holding_it(tmp_path, monkeypatch, out):
    work = tmp_path / "project"
    work.mkdir()
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(work)
    out = {"WORK": str(work), "PARENT": str(tmp_path)}.get(out, out)
    says = ("--out is empty: pass the folder to write." if not out.strip() else
            f"--out {out} is the working directory or one of its parents: pass a new folder to write into.")
    with pytest.raises(UserError, match=f"^{re.escape(says)}$"):
        with folder_swap.replace_folder(out):
            raise AssertionError("nothing is built for a refused folder")
    assert (work / "keep.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["project"]
    # A new folder inside the working directory is fine.
    with folder_swap.replace_folder("tokens") as building:
        assert building == str(work / "tokens.partial")
    assert (work / "tokens").is_dir() and (work / "keep.txt").exists()


def test_distinct_inputs_refuses_one_path_given_twice_however_spelled(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "run")
    run = str(tmp_path / "run")
    assert path_checks.distinct_inputs([run, str(tmp_path / "other")], "run folder") == [run, str(tmp_path / "other")]
    with pytest.raises(UserError, match=r"run folder '.*run' is given twice: pass each once\.$"):
        path_checks.distinct_inputs([run, run], "run folder")
    for spelling in (run + "/", str(tmp_path / "run" / ".." / "run"), str(tmp_path / "link")):
        with pytest.raises(UserError, match="name the same file or folder"):
            path_checks.distinct_inputs([run, spelling], "run folder")


def test_one_writer_builds_a_folder_at_a_time_and_a_killed_writers_leftovers_are_cleared(tmp_path):
    target = tmp_path / "out"
    with folder_swap.replace_folder(str(target)) as building:
        (tmp_path / "out.partial" / "first.txt").write_text("first")
        with pytest.raises(locks.FolderBusy, match=rf"^another command \(pid {os.getpid()}\) is writing .*out now \(.*out"
                                                   r"\.partial is in use\): wait for it to finish, then rerun, or choose"):
            with folder_swap.replace_folder(str(target)):
                raise AssertionError("the second writer gets no folder")
        assert set(os.listdir(building)) - {folder_swap._BUILDING} == {"first.txt"}  # nothing of the second's mixed in
    assert os.listdir(target) == ["first.txt"] and sorted(os.listdir(tmp_path)) == ["out"]
    # A killed writer leaves its partial folder, marked as a writer's, and releases it (the lock dies with the
    # process): the next writer clears it.
    (tmp_path / "out.partial" / "sub").mkdir(parents=True)
    (tmp_path / "out.partial" / "stale.bin").write_bytes(b"half")
    (tmp_path / "out.partial" / folder_swap._BUILDING).write_bytes(b"")
    with folder_swap.replace_folder(str(target)) as building:
        assert set(os.listdir(building)) == {folder_swap._BUILDING}
        (tmp_path / "out.partial" / "second.txt").write_text("second")
    assert os.listdir(target) == ["second.txt"] and sorted(os.listdir(tmp_path)) == ["out"]


def test_a_folder_swap_never_touches_the_users_own_old_or_partial_folders(tmp_path):
    target, backup, mine = tmp_path / "out", tmp_path / "out.old", tmp_path / "out.partial"
    target.mkdir()
    (target / "a.txt").write_text("first")
    backup.mkdir()
    (backup / "important.txt").write_text("the user's backup")  # X.old is a natural name for one
    with folder_swap.replace_folder(str(target)):
        (tmp_path / "out.partial" / "b.txt").write_text("second")
    assert os.listdir(target) == ["b.txt"] and (backup / "important.txt").read_text() == "the user's backup"
    assert sorted(os.listdir(tmp_path)) == ["out", "out.old"]
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"out\.partial already exists and was not made by this command \(it holds "
                                        r"notes\.txt\): move it away"):
        with folder_swap.replace_folder(str(target)):
            raise AssertionError("nothing is built")
    assert os.listdir(mine) == ["notes.txt"] and os.listdir(target) == ["b.txt"]


def busy(by):
    return f"busy{by}: wait"


def test_a_held_run_folder_is_refused_to_a_second_holder_until_released(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "_LOCKS_TABLE", str(tmp_path / "none"))  # a system that does not say who holds it
    with locks.exclusive(str(tmp_path), busy):
        with pytest.raises(locks.FolderBusy, match="^busy: wait$"):
            with locks.exclusive(str(tmp_path), busy):
                pass
    with locks.exclusive(str(tmp_path), busy):
        pass


@pytest.mark.skipif(not os.path.isfile("/proc/locks"), reason="Linux's table of the locks held")
def test_a_held_folder_is_refused_naming_the_pid_of_the_process_that_holds_it(tmp_path):
    # Two runs started on one --workdir: the refusal said "another training process", and which of the user's
    # processes that was took a search.
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)", str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(locks.FolderBusy, match=rf"^busy \(pid {holder.pid}\): wait$"):
            with locks.exclusive(str(tmp_path), busy):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_a_file_system_that_cannot_lock_does_not_stop_a_run(tmp_path, monkeypatch):
    import errno

    def cannot(fd, op):  # NFS emulating flock with write locks on a read-only fd; Lustre mounted without flock
        raise OSError(errno.EBADF, "Bad file descriptor")
    monkeypatch.setattr(locks.fcntl, "flock", cannot)
    with locks.exclusive(str(tmp_path), busy):
        with folder_swap.replace_folder(str(tmp_path / "out")) as building:
            (tmp_path / "out.partial" / "a.txt").write_text("a")
            assert building == str(tmp_path / "out.partial")
    assert os.listdir(tmp_path / "out") == ["a.txt"]


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOSPC, "No space left on device"),  # Python's own writes (json, a PNG): no file named
    RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),  # safetensors (Rust)
    ValueError("RESOURCE_EXHAUSTED: Failed to write 70177 bytes to file 15: No space left on device "
               "[os_error_code='28']"),  # tensorstore (Orbax)
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 54400 vs 54288"),  # torch.save
], ids=["os", "rust", "tensorstore", "torch"])
def test_a_write_that_fails_on_a_full_disk_is_one_sentence_naming_the_output_and_leaves_nothing(tmp_path, monkeypatch,
                                                                                                 failure):
    # Found on a full tmpfs: figures and data prepare said only "error: No space left on device", export_torch ended
    # in safetensors' or torch's traceback, import_torch in tensorstore's paragraph.
    if "unexpected pos" in str(failure):  # torch names no cause: a file system with no space left tells
        monkeypatch.setattr(files.os, "statvfs", lambda folder: types.SimpleNamespace(f_bavail=0))
    out, folder = tmp_path / "m.safetensors", tmp_path / "tokens"
    out.write_text("the earlier export")
    folder.mkdir()
    (folder / "train.bin").write_text("the earlier tokens")
    with pytest.raises(UserError, match=rf"^{re.escape(str(out))} could not be written: its file system is full \(No "
                                        r"space left on device\): free disk space, or choose another path\.$"):
        with files.atomic_path(str(out)) as partial:
            open(partial, "w").write("half")
            raise failure
    with pytest.raises(UserError, match=rf"^{re.escape(str(folder))} could not be written: its file system is full "
                                        r"\(No space left on device\), and the folder is as it was: free disk space, or "
                                        r"choose another folder\.$"):
        with folder_swap.replace_folder(str(folder)) as building:
            open(os.path.join(building, "train.bin"), "w").write("half")
            raise failure
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors", "tokens"] and os.listdir(folder) == ["train.bin"]
    assert out.read_text() == "the earlier export" and (folder / "train.bin").read_text() == "the earlier tokens"


def test_a_refusal_or_a_stop_while_the_disk_is_full_is_not_said_as_the_full_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "statvfs", lambda folder: types.SimpleNamespace(f_bavail=0))
    for failure in (UserError("a refusal, said already"), KeyboardInterrupt()):
        with pytest.raises(type(failure)) as raised:
            with files.atomic_path(str(tmp_path / "x.json")):
                raise failure
        assert raised.value is failure
    assert os.listdir(tmp_path) == []


def test_a_folder_this_user_cannot_delete_is_refused_before_any_work(tmp_path, monkeypatch):
    # Found as a non-root user: `prepare --force` over a read-only token folder tokenised everything, swapped
    # the new folder in and left the old one beside it; the next run failed after its work. (Root may delete
    # anything, so the permission is faked here.)
    target = tmp_path / "out"
    (target / "sub").mkdir(parents=True)
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: str(p) != str(target / "sub") and access(p, mode))
    with pytest.raises(UserError, match=r"out cannot be replaced: this user cannot delete the files in .*sub; make "
                                        r"it writable, or choose another folder\.$"):
        with folder_swap.replace_folder(str(target)):
            raise AssertionError("nothing is built")
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_commands_results_appear_together_or_not_at_all(tmp_path):
    names = [str(tmp_path / n) for n in ("r.json", "r.csv", "r.png")]
    with files.results(replace=False):
        for name in names:
            files.write_text(name, name)
            assert not os.path.exists(name), "held until the block ends"
    assert [open(n).read() for n in names] == names
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C before the figure: no .json or .csv alone
        with files.results(replace=True):
            files.write_text(names[0], "new")
            files.write_text(names[1], "new")
            raise KeyboardInterrupt
    assert [open(n).read() for n in names] == names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.json", "r.png"]  # no partial left


@pytest.mark.parametrize("hard_links", [True, False])
def test_a_result_another_command_wrote_meanwhile_is_refused_unless_replacing(tmp_path, monkeypatch, hard_links):
    if not hard_links:  # a file system without hard links: the same refusal by a check before the rename
        def no_links(src, dst):
            raise PermissionError(1, "Operation not permitted", src)
        monkeypatch.setattr(os, "link", no_links)
    first, second = str(tmp_path / "a.md"), str(tmp_path / "a.tex")
    with pytest.raises(UserError, match=r"a\.tex was written by another command while this one ran: nothing"):
        with files.results(replace=False):
            files.write_text(first, "mine")
            files.write_text(second, "mine")
            (tmp_path / "a.tex").write_text("theirs")  # the same command, started twice, finished first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tex"] and (tmp_path / "a.tex").read_text() == "theirs"
    with files.results(replace=True):
        files.write_text(first, "mine")
        files.write_text(second, "mine")
    assert (tmp_path / "a.tex").read_text() == "mine" and (tmp_path / "a.md").read_text() == "mine"


@pytest.mark.skipif(not os.path.isdir("/proc/self") or not os.path.isdir("/sys/kernel"), reason="Linux only")
def test_an_output_under_proc_or_sys_is_refused_naming_the_flag_before_any_work(tmp_path, monkeypatch):
    # Root passes os.access there, so train prepared its tokens and a bench timed every variant before
    # the OS refused the file ("error: /sys/x.json.<pid>.0.partial: Permission denied", no flag named).
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: True)  # as for root
    for check, path in ((files.output_file, "/proc/sps-jax-x.json"), (files.output_folder, "/sys/sps-jax-y"),
                        (files.output_file, "/sys/kernel/sps-jax-z/a.json")):
        parent = os.path.dirname(path).removesuffix("/sps-jax-z")
        with pytest.raises(UserError, match=rf"^--out {path} lies under {parent}, where no file can be made "
                                            r"\(.+\): choose another path\.$"):
            check(path, "--out")
    assert path_checks.cannot_create(str(tmp_path)) is None and os.listdir(tmp_path) == []  # the probe file is gone


@pytest.mark.parametrize("kind", ["loop", "missing target"])
def test_an_input_file_that_is_a_link_leading_nowhere_is_called_one(tmp_path, kind):
    # Before: "prompts file 'p.txt' does not exist", of a link the user can see with ls (generate --prompts-file,
    # --config, evaluate table, figures, import_torch).
    link = tmp_path / "p.txt"
    os.symlink("p.txt" if kind == "loop" else "gone.txt", link)
    with pytest.raises(reading.NotAFile) as refusal:
        reading.input_file(str(link), "prompts file", "pass a text file")
    assert str(refusal.value) == (f"prompts file {str(link)!r} is a link that leads nowhere (its target is missing, "
                                  "or links point at each other in a loop): pass a text file.")


def test_an_input_that_is_no_regular_file_is_called_that_not_missing(tmp_path):
    # /dev/stdin or a pipe given where a file is read was said not to exist.
    with pytest.raises(reading.NotAFile, match=rf"^prompts file {os.devnull!r} is no regular file \(a pipe, a device or a "
                                               r"socket\): pass a file\.$"):
        reading.input_file(os.devnull, "prompts file", "pass a file")
    with pytest.raises(reading.NotAFile, match=r"does not exist: pass a file\.$"):
        reading.input_file(str(tmp_path / "missing.txt"), "prompts file", "pass a file")


@pytest.mark.parametrize("value, sentence", [
    ("run1", "runs must be a list of paths, not the one path 'run1': pass ['run1']."),
    (7, "runs must be a list of paths (str or pathlib.Path), not a int: pass e.g. [path1, path2]."),
    ({"a": "run1"}, "runs must be a list of paths (str or pathlib.Path), not a dict: pass e.g. [path1, path2]."),
    (["run1", 3], "runs[1] must be one path (a str or pathlib.Path), not a int: pass the path itself."),
])
def test_a_list_of_paths_is_a_list_and_each_of_it_one_path(value, sentence):
    """A str would be iterated one character at a time (runs 'r', 'u', 'n', '1'), and a dict by its keys."""
    with pytest.raises(TypeError) as e:
        path_checks.path_list(value, "runs")
    assert str(e.value) == sentence


def test_a_list_of_paths_comes_back_as_text():
    import pathlib

    assert path_checks.path_list((pathlib.Path("a/b"), "c"), "runs") == ["a/b", "c"]


def test_an_output_that_is_a_device_or_a_fifo_is_refused_even_with_force(tmp_path):
    # `generate --out /dev/null --force` renamed its result over /dev/null: the device node became a file.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "to_null"
    link.symlink_to(os.devnull)
    for path, kind in ((fifo, "a FIFO"), (link, "a character device")):
        with pytest.raises(UserError, match=f"is not a regular file \\({kind}\\): pass the path of a file"):
            files.output_file(str(path), "--out", force=True)
        with pytest.raises(UserError, match="is not a regular file"):  # the notebook's writers check it too
            files.write_json(str(path), {"a": 1})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and stat.S_ISCHR(os.stat(os.devnull).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe", "to_null"]  # no partial file left


@pytest.mark.parametrize("target", ["moved-away.json", "loop.json"])
def test_a_link_leading_nowhere_at_the_output_path_is_kept_unless_forced_and_said_as_a_link(tmp_path, target):
    # The writer's rename replaces the link itself: the name is kept unless --force, as a file's would be, and said
    # as a link that leads nowhere ("already exists" named a file that could not be found to move away).
    link = tmp_path / "results.json"
    link.symlink_to(tmp_path / target)
    (tmp_path / "loop.json").symlink_to(tmp_path / "loop.json")
    with pytest.raises(UserError) as refused:
        files.output_file(str(link), "--out")
    assert str(refused.value) == (f"--out {link} is a link that leads nowhere (its target is missing, or links point "
                                  "at each other in a loop): remove the link, pass --force to put the file in its "
                                  "place, or choose another name.")
    assert files.output_file(str(link), "--out", force=True) == str(link)


def test_a_file_name_of_exactly_the_file_systems_limit_is_written(tmp_path):
    longest = "a" * 250 + ".json"  # 255 bytes, the most a name may have
    assert files.output_file(str(tmp_path / longest), "--out") == str(tmp_path / longest)
    files.write_text(str(tmp_path / longest), "x")
    assert (tmp_path / longest).read_text() == "x"
    with pytest.raises(UserError, match=r"the file name is 256 bytes, more than the 255 a file system allows"):
        files.output_file(str(tmp_path / ("b" + longest)), "--out")


def test_a_folder_whose_name_extends_an_input_folders_name_is_not_inside_it(tmp_path):
    # run2/ is beside run/, not in it: the text "run" being a prefix of "run2" makes no parent folder.
    (tmp_path / "run").mkdir()
    (tmp_path / "run2").mkdir()
    assert path_checks.inside(str(tmp_path / "run" / "a.json"), str(tmp_path / "run"))
    assert not path_checks.inside(str(tmp_path / "run2" / "a.json"), str(tmp_path / "run"))
    assert not path_checks.inside(str(tmp_path / "run"), str(tmp_path / "run"))  # the folder itself is not in it
    inputs = [("the run folder", str(tmp_path / "run"))]
    beside = str(tmp_path / "run2" / "a.json")
    assert files.output_file(beside, "--out", inputs=inputs) == beside
    with pytest.raises(UserError, match="lies in the run folder"):
        files.output_file(str(tmp_path / "run" / "a.json"), "--out", inputs=inputs)


def test_a_name_the_output_check_accepts_is_one_the_writer_can_write(tmp_path):
    # The writer's partial name was cut by characters: 245 bytes of two-byte characters overran the limit there.
    name = "\u00e9" * 120 + ".json"  # 245 bytes
    path = str(tmp_path / name)
    assert files.output_file(path, "--out") == path
    files.write_text(path, "x")
    assert (tmp_path / name).read_text() == "x"


def test_a_folder_whose_name_is_near_the_limit_is_replaced_after_its_work(tmp_path, monkeypatch):
    # The old folder's aside name (<name>.<8 random>.old) ran past 255 bytes once the new folder was built.
    monkeypatch.chdir(tmp_path)
    target = tmp_path / ("a" * 245)
    target.mkdir()
    (target / "old.txt").write_text("old")
    with folder_swap.replace_folder(str(target)):
        (tmp_path / (target.name + ".partial") / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"]


def test_a_path_given_to_the_api_with_an_unexpanded_home_is_one_sentence_and_makes_no_folder(tmp_path, monkeypatch):
    # The command line refuses '~/x' (no shell expanded it); from Python the same path made a folder '~' in the working
    # directory, where a later `rm -rf ~` to clean it up would take the home folder.
    from sps_jax import config as sps_config, runs, trainer
    from sps_jax.analysis import figures
    from sps_jax.data import prepare
    from sps_jax.evaluation import evaluate

    monkeypatch.chdir(tmp_path)
    home = os.path.expanduser("~")
    calls = [("workdir", lambda: trainer.train(sps_config.load_config("configs/tiny.py"), "~/runs/x")),
             ("path", lambda: evaluate.write_json("~/e.json", {})),
             ("out_png", lambda: figures.training_curves({"a": str(tmp_path)}, "~/c.png")),
             ("out", lambda: prepare.prepare(str(tmp_path), "~/tokens")),
             ("workdir", lambda: runs.save_run("~/saved", sps_config.load_config("configs/tiny.py"), {}, 1))]
    for name, call in calls:
        with pytest.raises(UserError) as refusal:
            call()
        assert str(refusal.value).startswith(f"{name} '~/") and "' starts with '~', which was not expanded to the home " \
            f"folder (a shell leaves it after '=' or in quotes, Python always), so it would name a folder '~' here: pass " \
            f"'{home}/" in str(refusal.value), (name, refusal.value)
    assert not os.path.lexists(tmp_path / "~")


def test_a_name_holding_bytes_that_are_not_utf8_is_written_as_given(tmp_path):
    # A shell passes such bytes through (--out $'bad\xff.jsonl'): the name checks failed with Python's "'utf-8' codec
    # can't encode character '\udcff'", naming no flag.
    name = b"bad\xff.jsonl".decode("utf-8", "surrogateescape")
    path = str(tmp_path / name)
    path_checks.check_name_lengths(path, "--out")
    with files.atomic_open(path) as f:
        f.write("x")
    assert os.listdir(os.fsencode(tmp_path)) == [b"bad\xff.jsonl"]


def test_names_past_the_file_systems_limit_are_one_sentence_before_any_work(tmp_path):
    # A 250-byte --out folder is a legal name, but the folder it is built in (NAME.partial) is not: the OS said "File
    # name too long" of that internal name; a 300-byte --workdir got the OS's words too.
    built = str(tmp_path / ("m" * 250))
    with pytest.raises(UserError, match=rf"^--out {built}: the file name is 250 bytes, and the '.partial' folder it "
                                        r"is built in needs 258, more than the 255 a file system allows: choose a "
                                        r"shorter name\.$"):
        files.output_folder(built)
    files.output_folder(str(tmp_path / ("m" * 247)))  # 247 + 8 fits
    deep = str(tmp_path / ("w" * 300) / "run")
    with pytest.raises(UserError, match=r"^--workdir .*: the folder name 'wwwwwwwwwwwwwwwwwwww'\.\.\. in it is 300 "
                                        r"bytes, more than the 255 a file system allows: choose a shorter name\.$"):
        path_checks.check_folder_place(deep, "--workdir", "pass a new folder")
    assert os.listdir(tmp_path) == []


def test_a_write_whose_rename_fails_leaves_no_partial_file(tmp_path):
    # A folder where the file goes: the run failed after its last step and left loss.png.<pid>.<n>.partial behind.
    (tmp_path / "loss.png").mkdir()
    with pytest.raises(OSError):
        with files.atomic_open(str(tmp_path / "loss.png"), "wb") as f:
            f.write(b"png")
    assert os.listdir(tmp_path) == ["loss.png"]


@pytest.mark.parametrize("stem, suffixes, given", [("/dev/null", ".md and .tex", "/dev/null"),
                                                   ("/dev/null", ".png", "/dev/null.png")])
def test_a_name_whose_stem_is_a_device_is_refused(stem, suffixes, given):
    # evaluate table --out /dev/null wrote the regular files /dev/null.md and /dev/null.tex (as root).
    with pytest.raises(UserError) as refusal:
        path_checks.check_stem(stem, given, suffixes, "results/table")
    assert str(refusal.value) == (f"--out {given}: /dev/null is a character device, which the {suffixes} files cannot "
                                  "be named after: pass another file name.")
    path_checks.check_stem("/tmp/table", "/tmp/table", suffixes, "results/table")  # a name that is no device


def test_a_json_object_with_one_key_twice_is_one_sentence(tmp_path):
    # A prompts line {"prompt": "a", "prompt": "b"} generated from "b" without a word (json keeps the last value).
    with pytest.raises(UserError) as refusal:
        reading.parse_json('{"prompt": "a", "x": {"k": 1, "k": 2}}', "p.jsonl", line=3, hint="fix that line")
    assert str(refusal.value) == "p.jsonl line 3 is not usable JSON (the key 'k' appears twice in one object): fix " \
        "that line."
    assert reading.parse_json('{"a": {"a": 1}}', "p.json") == {"a": {"a": 1}}  # one key per object, nested alike


def test_a_default_result_name_that_is_a_folder_says_how_to_write_elsewhere(tmp_path):
    # evaluate's RUN/eval/step_16.json as a folder said "pass a file name, for example .../step_16.json/results.json",
    # of a name the user never gave; a RUN/eval link that leads nowhere was "a file".
    (tmp_path / "step_16.json").mkdir()
    with pytest.raises(UserError) as refusal:
        files.output_file(str(tmp_path / "step_16.json"), "the results file", rename="--out to write elsewhere")
    assert str(refusal.value) == (f"the results file {tmp_path / 'step_16.json'} is a folder: move it away, or --out "
                                  "to write elsewhere.")
    os.symlink(tmp_path / "missing", tmp_path / "eval")
    with pytest.raises(UserError) as refusal:
        files.output_file(str(tmp_path / "eval" / "step_1.json"), "--out")
    assert str(refusal.value) == (f"--out {tmp_path / 'eval' / 'step_1.json'} lies under {tmp_path / 'eval'}, which is "
                                  "a link that leads nowhere (its target is missing, or links point at each other in a "
                                  "loop): choose another path.")


def test_a_partial_name_cut_to_fit_keeps_whole_characters(tmp_path):
    # A cut through a two-byte character left half of it, which no UTF-8 file system (APFS) takes in a name.
    name = "é" * 120 + ".json"  # 245 bytes: with the partial suffix it is cut
    with files.atomic_path(str(tmp_path / name)) as partial:
        base = os.path.basename(partial)
        assert len(base.encode("utf-8")) <= path_checks.NAME_MAX and base.startswith("é" * 100)
        open(partial, "w").close()
    assert os.listdir(tmp_path) == [name]


@pytest.fixture
def ctrl_c_handled_as_a_command():
    """SIGINT raises as in a command run from the command line (cli.main's handler), for this test only."""
    import signal

    from sps_jax import cli

    previous = signal.signal(signal.SIGINT, cli.raise_stop)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("replace", [True, False])
def test_a_ctrl_c_between_the_renames_of_a_commands_results_lands_once_all_are_in_place(
        tmp_path, monkeypatch, ctrl_c_handled_as_a_command, replace):
    # table --force interrupted between its two renames left OUT.md new beside the earlier OUT.tex (without --force,
    # OUT.md alone): the pair no longer matched. The stop now waits for the last rename.
    import signal

    md, tex = str(tmp_path / "t.md"), str(tmp_path / "t.tex")
    if replace:
        for name in (md, tex):
            files.write_text(name, "old")
    rename = os.replace if replace else os.link

    def ctrl_c_after_the_first(src, dst):
        rename(src, dst)
        if dst == md:
            os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, right between the two renames

    monkeypatch.setattr(os, "replace" if replace else "link", ctrl_c_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        with files.results(replace):
            files.write_text(md, "new")
            files.write_text(tex, "new")
    assert [open(name).read() for name in (md, tex)] == ["new", "new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.md", "t.tex"]


def test_a_ctrl_c_while_a_folder_is_swapped_in_leaves_the_new_folder_in_place(
        tmp_path, monkeypatch, ctrl_c_handled_as_a_command):
    # A Ctrl-C after the old folder was moved aside, before the new one took its name, left no folder at the path:
    # the old one sat in OUT.<random>.old and the new one was deleted. The stop now lands once the swap is done.
    import signal

    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    real_rename = os.rename

    def ctrl_c_once_the_old_folder_is_aside(src, dst):
        real_rename(src, dst)
        if os.path.dirname(dst).endswith(".old"):  # moved into OUT.<random>.old
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "rename", ctrl_c_once_the_old_folder_is_aside)
    with pytest.raises(KeyboardInterrupt):
        with folder_swap.replace_folder(str(target)) as building:
            (tmp_path / "out.partial" / "new.txt").write_text("new")
            assert building == str(tmp_path / "out.partial")
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the old folder deleted, nothing else left


class _Listing(list):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("cut_short", ["own cleanup", "a failed swap's", "clearing a killed writer's"])
def test_a_second_ctrl_c_while_a_partial_folder_is_deleted_leaves_it_for_the_rerun_to_clear(
        tmp_path, monkeypatch, ctrl_c_handled_as_a_command, cut_short):
    # A Ctrl-C during the delete of OUT.partial (after a first stop, or while a rerun cleared a killed writer's) could
    # take the mark first and leave the data: the next rerun refused OUT.partial as "not made by this command".
    import signal

    target, partial = tmp_path / "out", tmp_path / "out.partial"
    real_listdir, real_scandir, real_remove, real_unlink = os.listdir, os.scandir, os.remove, os.unlink

    def in_name_order(path="."):  # as a file system listing by name or by creation lists: the mark first
        with real_scandir(path) as entries:
            return _Listing(sorted(entries, key=lambda entry: entry.name))

    deleted = []

    def ctrl_c_at_the_second_data_file(real):
        def delete(path, *args, **kwargs):
            if str(path).endswith(".bin"):  # a data file of the partial folder
                deleted.append(path)
                if len(deleted) == 2:
                    os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, half way through the delete
            real(path, *args, **kwargs)
        return delete

    def cut_short_deletes():
        monkeypatch.setattr(os, "listdir", lambda path=".": sorted(real_listdir(path)))
        monkeypatch.setattr(os, "scandir", in_name_order)
        monkeypatch.setattr(os, "remove", ctrl_c_at_the_second_data_file(real_remove))
        monkeypatch.setattr(os, "unlink", ctrl_c_at_the_second_data_file(real_unlink))

    if cut_short in ("own cleanup", "a failed swap's"):  # the swap takes the mark off before its rename
        if cut_short == "a failed swap's":
            def no_room(src, dst):
                raise OSError(28, "No space left on device")
            monkeypatch.setattr(os, "rename", no_room)
        with pytest.raises(KeyboardInterrupt):
            with folder_swap.replace_folder(str(target)):
                for name in ("a.bin", "b.bin", "c.bin"):
                    (partial / name).write_bytes(b"data")
                cut_short_deletes()
                if cut_short == "own cleanup":
                    raise KeyboardInterrupt  # the first stop
    else:
        partial.mkdir()
        (partial / folder_swap._BUILDING).write_bytes(b"")
        for name in ("a.bin", "b.bin", "c.bin"):
            (partial / name).write_bytes(b"data")
        cut_short_deletes()
        with pytest.raises(KeyboardInterrupt):
            with folder_swap.replace_folder(str(target)):
                raise AssertionError("the stop lands while the leftovers are cleared")
    monkeypatch.undo()
    assert len(deleted) == 2 and (partial / "c.bin").exists()  # the delete was cut short
    with folder_swap.replace_folder(str(target)):
        (partial / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_ctrl_c_held_through_a_folder_swap_never_deletes_the_next_writers_partial_folder(
        tmp_path, monkeypatch, ctrl_c_handled_as_a_command):
    # The stop held through the swap lands once OUT.partial is renamed to OUT; the cleanup then deleted whatever
    # held the name OUT.partial by then: the partial folder a second command had claimed meanwhile.
    import signal

    target, partial = tmp_path / "out", tmp_path / "out.partial"
    real_swap_in = folder_swap._swap_in

    def swap_in_then_the_next_writer_claims(*args):
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, held until the swap is done
        real_swap_in(*args)
        partial.mkdir()  # a second command's, begun right after the rename
        (partial / folder_swap._BUILDING).write_bytes(b"")
        (partial / "theirs.bin").write_bytes(b"data")

    monkeypatch.setattr(folder_swap, "_swap_in", swap_in_then_the_next_writer_claims)
    with pytest.raises(KeyboardInterrupt):
        with folder_swap.replace_folder(str(target)):
            (partial / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert (partial / "theirs.bin").read_bytes() == b"data"


def _write_one_file(path):
    files.write_json(path, {"a": 1})


def _write_a_result_alone(path):
    with files.results(replace=False):
        files.write_text(path, "result")


def _replace_a_result(path):
    files.write_text(path, "old")
    with files.results(replace=True):
        files.write_text(path, "result")


@pytest.mark.parametrize("write", [_write_one_file, _write_a_result_alone, _replace_a_result])
def test_a_file_is_flushed_to_the_disk_before_its_rename_and_its_folder_after(tmp_path, monkeypatch, write):
    # A power cut after the rename could leave an empty file where the old one was: the rename reached the disk
    # before the data it names, and without a flush of the folder the rename itself may not reach it.
    path = tmp_path / "out.json"
    events = flushes_and_renames(monkeypatch)
    write(str(path))
    file, folder = path.stat().st_ino, tmp_path.stat().st_ino
    last_rename = max(n for n, event in enumerate(events) if event == ("rename", file))
    assert ("fsync", file) in events[:last_rename], "the file's data is on the disk before its name is"
    assert ("fsync", folder) in events[last_rename + 1:], "the folder's new name is on the disk before the write ends"


@pytest.mark.parametrize("earlier", [False, True])
def test_a_folder_is_flushed_to_the_disk_whole_before_it_is_swapped_in_and_its_parent_after(
        tmp_path, monkeypatch, earlier):
    target = tmp_path / "out"
    if earlier:
        target.mkdir()
        (target / "old.txt").write_text("old")
    events = flushes_and_renames(monkeypatch)
    with folder_swap.replace_folder(str(target)) as building:
        os.mkdir(os.path.join(building, "sub"))
        (tmp_path / "out.partial" / "sub" / "new.bin").write_bytes(b"new")
    inodes = [p.stat().st_ino for p in (target / "sub" / "new.bin", target / "sub", target)]
    first_rename = min(n for n, event in enumerate(events) if event[0] == "rename")
    swapped = max(n for n, event in enumerate(events) if event == ("rename", target.stat().st_ino))
    assert all(("fsync", inode) in events[:first_rename] for inode in inodes), \
        "every file and folder of the new one is on the disk before the old one moves"
    assert ("fsync", tmp_path.stat().st_ino) in events[swapped + 1:]


def _kill_at(step: str, target: str) -> str:
    """A script that replaces the folder ``target`` and is killed (SIGKILL) at ``step`` of the swap."""
    return f"""
import os, shutil, signal, sys
from sps_jax import folder_swap
target, step = {target!r}, {step!r}
real_rename, real_replace, real_rmtree = os.rename, os.replace, shutil.rmtree

def kill():
    os.kill(os.getpid(), signal.SIGKILL)

def renaming(real):
    def rename(src, dst):
        if step == "before the old folder moves aside" and src == target:
            kill()
        if step == "between the two renames" and dst == target:
            kill()
        real(src, dst)
    return rename

def rmtree(path, *args, **kwargs):
    if step == "before the old folder is deleted" and path.endswith(".old"):
        kill()
    real_rmtree(path, *args, **kwargs)

os.rename, os.replace, shutil.rmtree = renaming(real_rename), renaming(real_replace), rmtree
with folder_swap.replace_folder(target):
    open(os.path.join(target + ".partial", "new.txt"), "w").write("new")
"""


@pytest.mark.parametrize("step", ["before the old folder moves aside", "between the two renames",
                                  "before the old folder is deleted"])
def test_a_command_killed_while_swapping_a_folder_in_loses_nothing_and_its_rerun_mends_the_folder(
        tmp_path, capsys, step):
    # Killed between moving the old folder aside and renaming the new one into place, a command left no folder at
    # the path, and its rerun refused OUT.partial (unmarked by then) as not its own: the old output was reachable
    # only under OUT.<random>.old. Killed before deleting the old one, that stayed beside the new one for good.
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    killed = subprocess.run([sys.executable, "-c", _kill_at(step, str(target))], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert killed.returncode == -9, killed.stderr
    capsys.readouterr()
    with pytest.raises(RuntimeError):  # the rerun fails too: the old output is there all the same
        with folder_swap.replace_folder(str(target)):
            assert sorted(os.listdir(tmp_path)) == ["out", "out.partial"]
            raise RuntimeError("the source failed")
    if step == "between the two renames":
        assert (target / "old.txt").read_text() == "old"
        assert f"{target} was moved aside to " in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["out"]
    with folder_swap.replace_folder(str(target)):
        (tmp_path / "out.partial" / "newer.txt").write_text("newer")
    assert os.listdir(target) == ["newer.txt"] and sorted(os.listdir(tmp_path)) == ["out"]


def test_a_users_folder_named_like_an_aside_folder_is_never_moved_or_deleted(tmp_path):
    target, theirs = tmp_path / "out", tmp_path / "out.abcdefgh.old"
    theirs.mkdir()
    (theirs / "mine.txt").write_text("mine")
    with folder_swap.replace_folder(str(target)):
        (tmp_path / "out.partial" / "new.txt").write_text("new")
    assert os.listdir(target) == ["new.txt"] and (theirs / "mine.txt").read_text() == "mine"


_WRITE_AND_WAIT = """
import os, signal, sys
from sps_jax import files
with files.atomic_open(sys.argv[1]) as f:
    f.write("half")
    f.flush()
    print(os.path.basename(f.name), flush=True)
    if sys.argv[2] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.read()  # a live writer, until the test lets it finish
"""


@pytest.mark.parametrize("live_writer", ["here", "on another host"])
def test_the_next_write_of_a_file_deletes_the_partial_file_a_killed_writer_left_and_nothing_else(
        tmp_path, monkeypatch, live_writer):
    # A command killed mid-write left OUT.<pid>.<n>.partial beside its output for good; a writer that is still
    # writing (another command, here or on another host), another output's partial file and the user's files stay.
    out = tmp_path / "out.json"
    if live_writer == "on another host":  # its pid names no process here: its lock alone tells it is writing
        monkeypatch.setattr(files, "_gone", lambda pid: True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    live = subprocess.Popen([sys.executable, "-c", _WRITE_AND_WAIT, str(out), "live"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        writing = live.stdout.readline().strip()
        killed, other = (subprocess.run([sys.executable, "-c", _WRITE_AND_WAIT, str(name), "killed"],
                                        capture_output=True, text=True, env=env) for name in (out, tmp_path / "o.json"))
        assert killed.returncode == other.returncode == -9, killed.stderr
        theirs = ["out.json.partial", "out.json.1.partial", "out.json.old"]
        for name in theirs:
            (tmp_path / name).write_text("mine")
        left, other = killed.stdout.strip(), other.stdout.strip()
        assert {left, other, writing} <= set(os.listdir(tmp_path))
        files.write_json(str(out), {"a": 1})
        assert sorted(os.listdir(tmp_path)) == sorted(["out.json", other, writing] + theirs)
    finally:
        live.communicate("")
    assert live.returncode == 0 and sorted(os.listdir(tmp_path)) == sorted(["out.json", other] + theirs)
