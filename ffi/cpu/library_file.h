// A kernel library held in memory, made into something dlopen() can open.
#pragma once

#include <string>
#include <string_view>

namespace jaxtile {

// How the bytes become a file: an anonymous memory file (Linux memfd, nothing on disk), or a
// private temporary file under $TMPDIR (default /tmp). Either is closed (and deleted) when
// the LibraryFile goes, which is fine once it is dlopen()ed: the mapping keeps the library.
enum class FileKind { kMemory, kTemporary };

class LibraryFile {
 public:
  // Writes `bytes`; `tag` (a kernel key) makes the name of a temporary file unique to the
  // library. Throws std::runtime_error.
  LibraryFile(std::string_view bytes, std::string_view tag, FileKind kind);
  ~LibraryFile();
  LibraryFile(const LibraryFile&) = delete;
  LibraryFile& operator=(const LibraryFile&) = delete;

  // A path no earlier LibraryFile of this process had: dlopen() returns the library already
  // loaded under a name instead of opening the file, and descriptor numbers are reused once
  // closed, so a memory file's /proc/self/fd path is spelled differently every time.
  const std::string& path() const { return path_; }

 private:
  void close();

  FileKind kind_;
  int fd_ = -1;
  std::string path_;
};

}  // namespace jaxtile
