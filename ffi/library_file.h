// A kernel library held in memory, made into something dlopen() can open.
#pragma once

#include <string>
#include <string_view>

namespace jaxtile {

// How the bytes become a file: an anonymous memory file (Linux memfd, nothing on disk), or a
// private temporary file under $TMPDIR (default /tmp) that is deleted once dlopen()ed.
enum class FileKind { kMemory, kTemporary };

class LibraryFile {
 public:
  // Writes `bytes`; `tag` (a kernel key) makes the name of a temporary file unique to the
  // library. Throws std::runtime_error.
  LibraryFile(std::string_view bytes, std::string_view tag, FileKind kind);
  ~LibraryFile();
  LibraryFile(const LibraryFile&) = delete;
  LibraryFile& operator=(const LibraryFile&) = delete;

  const std::string& path() const { return path_; }

  // Call once the library is loaded for good. A memory file then stays open for the life of
  // the process: the loader knows the library by its /proc/self/fd path, and a later memory
  // file reusing the descriptor number would otherwise be mistaken for it.
  void keep();

 private:
  void close();

  FileKind kind_;
  int fd_ = -1;
  std::string path_;
  bool kept_ = false;
};

}  // namespace jaxtile
