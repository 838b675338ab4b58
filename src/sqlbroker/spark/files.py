"""Moving and deleting export files through Hadoop's FileSystem, so that the archive
pipeline works unchanged on a local disk, HDFS or an object store under ``spark-submit``."""

from __future__ import annotations

from typing import Any


class Files:
    """A few FileSystem operations on paths of one export root."""

    def __init__(self, spark: Any, root: str) -> None:
        jvm = spark.sparkContext._jvm
        self._path = jvm.org.apache.hadoop.fs.Path
        self._fs = self._path(root).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._path(path)))

    def delete(self, path: str) -> None:
        self._fs.delete(self._path(path), True)

    def children(self, path: str) -> list[str]:
        """Full paths of the entries of a directory (none when it does not exist)."""
        if not self.exists(path):
            return []
        return [str(status.getPath()) for status in self._fs.listStatus(self._path(path))]

    def files(self, path: str) -> list[str]:
        """Every file below ``path``, recursively (none when it does not exist)."""
        if not self.exists(path):
            return []
        found = []
        iterator = self._fs.listFiles(self._path(path), True)
        while iterator.hasNext():
            found.append(str(iterator.next().getPath()))
        return found

    def move(self, source: str, target: str) -> None:
        destination = self._path(target)
        self._fs.mkdirs(destination.getParent())
        if not self._fs.rename(self._path(source), destination):
            raise OSError(f"could not move {source} to {target}")
