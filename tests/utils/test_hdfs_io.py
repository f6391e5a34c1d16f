"""verl.utils.hdfs_io on local paths (exists, makedirs, copy of files and directories) and its refusal of hdfs://
paths, which need a Hadoop client this installation does not use."""

import pytest

from verl.utils import hdfs_io


def test_local_paths(tmp_path):
    target = tmp_path / "a" / "b"
    assert not hdfs_io.exists(str(target))
    hdfs_io.makedirs(str(target))
    assert hdfs_io.exists(str(target))
    with pytest.raises(FileExistsError):
        hdfs_io.makedirs(str(target))
    hdfs_io.makedirs(str(target), exist_ok=True)

    (target / "w.txt").write_text("weights")
    assert hdfs_io.copy(str(target / "w.txt"), str(tmp_path)) == str(tmp_path / "w.txt")  # into a directory
    assert (tmp_path / "w.txt").read_text() == "weights"
    assert hdfs_io.copy(str(tmp_path / "a"), str(tmp_path / "copy")) == str(tmp_path / "copy")  # a tree
    assert (tmp_path / "copy" / "b" / "w.txt").read_text() == "weights"


@pytest.mark.parametrize("call", [
    lambda: hdfs_io.exists("hdfs://nn/ckpt"),
    lambda: hdfs_io.makedirs("hdfs://nn/ckpt", exist_ok=True),
    lambda: hdfs_io.copy("/tmp/x", "hdfs://nn/ckpt"),
])
def test_hdfs_paths_are_refused_by_name(call):
    with pytest.raises(ValueError, match="hdfs://nn/ckpt: hdfs:// paths need a Hadoop client"):
        call()
