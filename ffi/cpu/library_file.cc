#include "cpu/library_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace jaxtile {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

void write_all(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot write " + path);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

// "/proc/self/fd/<fd>", spelled uniquely for `serial`: each bit adds a "." component,
// followed by one slash for 0 and two for 1 (the kernel reads all spellings alike).
std::string unique_fd_path(int fd, uint64_t serial) {
  std::string path = "/proc/self/fd/";
  for (; serial != 0; serial >>= 1) path += (serial & 1) != 0 ? ".//" : "./";
  return path + std::to_string(fd);
}

int open_memory_file(std::string* path) {
#if defined(__linux__)
  static std::atomic<uint64_t> serial{0};
  const int fd = memfd_create("jaxtile-kernel", MFD_CLOEXEC);
  if (fd < 0) fail("memfd_create failed");
  *path = unique_fd_path(fd, serial.fetch_add(1));
  return fd;
#else
  (void)path;
  errno = ENOSYS;
  fail("memory files need Linux");
#endif
}

int open_temporary_file(std::string_view tag, std::string* path) {
  const char* dir = std::getenv("TMPDIR");
  std::string name = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
                     "/jaxtile-kernel-" + std::string(tag.substr(0, 32)) + "-XXXXXX";
  std::vector<char> buf(name.begin(), name.end());
  buf.push_back('\0');
  const int fd = mkostemp(buf.data(), O_CLOEXEC);
  if (fd < 0) fail("cannot create a temporary file like " + name);
  *path = buf.data();
  return fd;
}

}  // namespace

LibraryFile::LibraryFile(std::string_view bytes, std::string_view tag, FileKind kind)
    : kind_(kind) {
  fd_ = kind == FileKind::kMemory ? open_memory_file(&path_) : open_temporary_file(tag, &path_);
  try {
    write_all(fd_, bytes, path_);
  } catch (...) {
    close();
    throw;
  }
}

LibraryFile::~LibraryFile() { close(); }

void LibraryFile::close() {
  if (fd_ < 0) return;
  if (kind_ == FileKind::kTemporary) ::unlink(path_.c_str());
  ::close(fd_);
  fd_ = -1;
}

}  // namespace jaxtile
