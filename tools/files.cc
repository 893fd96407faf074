// attn tools: output-file checks and all-or-nothing writing. See files.h for the rules.
#include "files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace attn::tools {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) { return std::generic_category().message(err); }

std::string in_quotes(const std::string& path) { return "'" + path + "'"; }

// The path with symbolic links, "." and ".." resolved as far as it exists (the rest kept lexically), so
// "x.npy", "./x.npy" and "dir/../x.npy" compare equal.
fs::path canonical_path(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(path, ec);
  if (!ec) return p;
  p = fs::absolute(path, ec);
  return (ec ? fs::path(path) : p).lexically_normal();
}

// What identifies a file: its canonical path, and its device and inode when it exists.
struct Identity {
  fs::path canonical;
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  bool same_as(const Identity& other) const {
    return canonical == other.canonical || (exists && other.exists && dev == other.dev && ino == other.ino);
  }
};

// An input: stat() follows symbolic links, so a link to an input is that input.
Identity input_identity(const std::string& path) {
  Identity id;
  id.canonical = canonical_path(path);
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) id.exists = true, id.dev = st.st_dev, id.ino = st.st_ino;
  return id;
}

// Checks one output path on its own; fills *id.
Status check_output_path(const FileArg& out, Identity* id) {
  const std::string& path = out.path;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (const char* kind = special_file_kind(st.st_mode))
      return Status::Invalid(out.option, in_quotes(path) + " is " + kind + "; expected a new or regular file");
    id->exists = true, id->dev = st.st_dev, id->ino = st.st_ino;
    // The rename would replace it even if it is read-only; refuse what could not be opened for writing.
    if (::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) != 0 && errno == EACCES)
      return Status::Invalid(out.option, in_quotes(path) + " is not writable; expected a new or writable regular file");
  } else if (errno == ENOTDIR) {
    return Status::Invalid(out.option, in_quotes(path) + " has a parent that is not a directory; expected a path in "
                                                      "an existing directory");
  } else if (errno != ENOENT) {
    const int err = errno;
    return Status::Invalid(out.option, "cannot check " + in_quotes(path) + " (" + errno_text(err) +
                                           "); expected a path that can be written");
  } else {  // a new file: its directory must exist
    fs::path dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
    struct stat dst;
    if (::stat(dir.c_str(), &dst) != 0) {
      const int err = errno;
      return Status::Invalid(out.option, "directory " + in_quotes(dir.string()) + " of " + in_quotes(path) +
                                             (err == ENOENT ? " does not exist" : " cannot be used (" + errno_text(err) + ")") +
                                             "; expected an existing directory");
    }
    if (!S_ISDIR(dst.st_mode))
      return Status::Invalid(out.option, in_quotes(dir.string()) + " in " + in_quotes(path) +
                                             " is not a directory; expected an existing directory");
  }
  id->canonical = canonical_path(path);
  return Status::Ok();
}

std::atomic<unsigned> temp_counter{0};

}  // namespace

const char* special_file_kind(mode_t mode) {
  if (S_ISREG(mode)) return nullptr;
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

Status check_outputs(const std::vector<FileArg>& outputs, const std::vector<FileArg>& inputs) {
  std::vector<Identity> in_ids(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].path.empty()) in_ids[i] = input_identity(inputs[i].path);
  std::vector<Identity> out_ids(outputs.size());
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    const FileArg& out = outputs[o];
    if (out.path.empty()) {
      if (out.required) return Status::Invalid(out.option, "empty path; expected a file name");
      continue;
    }
    if (Status s = check_output_path(out, &out_ids[o]); !s) return s;
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (!inputs[i].path.empty() && out_ids[o].same_as(in_ids[i]))
        return Status::Invalid(out.option, in_quotes(out.path) + " is the same file as " + inputs[i].option +
                                               "; expected an output path that is not an input");
    for (std::size_t p = 0; p < o; ++p)
      if (!outputs[p].path.empty() && out_ids[o].same_as(out_ids[p]))
        return Status::Invalid(out.option, in_quotes(out.path) + " is the same file as " + outputs[p].option +
                                               "; expected a different path");
  }
  return Status::Ok();
}

// ---- FileWriter ------------------------------------------------------------------------------------------

FileWriter::~FileWriter() { discard(); }

void FileWriter::discard() {
  for (const Staged& s : staged_) ::unlink(s.tmp.c_str());
  staged_.clear();
}

Status FileWriter::stage(const std::string& what, const std::string& path, std::string_view bytes) {
  if (path.empty()) return Status::Invalid(what, "empty path; expected a file name");
  // A fresh name in the destination's directory (the final rename then stays within one file system and is
  // atomic; the name does not grow with the destination's), created exclusively so an existing file or a
  // planted symbolic link is never followed.
  const std::string dir = fs::path(path).parent_path().string();
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 64 && fd < 0; ++attempt) {
    tmp = (dir.empty() ? "" : dir + "/") + ".attn-tmp." + std::to_string(static_cast<long>(::getpid())) + "." +
          std::to_string(temp_counter++);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    const int err = errno;
    return Status::Invalid(what, "cannot create " + in_quotes(tmp) + " (" + errno_text(err) + "); expected a writable directory");
  }
  int err = 0;
  for (std::size_t done = 0; done < bytes.size() && err == 0;) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n > 0) done += static_cast<std::size_t>(n);
    else if (n < 0 && errno != EINTR) err = errno;
    else if (n == 0) err = EIO;
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return Status::Invalid(what, "cannot write " + in_quotes(tmp) + " (" + errno_text(err) + "); expected a writable location");
  }
  staged_.push_back({what, path, tmp});
  return Status::Ok();
}

Status FileWriter::commit() {
  // Re-checked here, just before any rename: a destination that has become a FIFO, device, directory or
  // link since the command started is refused and nothing moves.
  for (const Staged& s : staged_) {
    struct stat st;
    if (::lstat(s.path.c_str(), &st) == 0)
      if (const char* kind = special_file_kind(st.st_mode)) {
        const Status status = Status::Invalid(s.what, in_quotes(s.path) + " is " + kind + "; expected a new or regular file");
        discard();
        return status;
      }
  }
  for (std::size_t i = 0; i < staged_.size(); ++i)
    if (::rename(staged_[i].tmp.c_str(), staged_[i].path.c_str()) != 0) {
      const int err = errno;
      const Status status = Status::Invalid(staged_[i].what, "cannot rename " + in_quotes(staged_[i].tmp) + " to " +
                                                                 in_quotes(staged_[i].path) + " (" + errno_text(err) +
                                                                 "); expected a writable location");
      staged_.erase(staged_.begin(), staged_.begin() + static_cast<std::ptrdiff_t>(i));  // those are in place
      discard();
      return status;
    }
  staged_.clear();
  return Status::Ok();
}

Status write_file(const std::string& what, const std::string& path, std::string_view bytes) {
  FileWriter writer;
  if (Status s = writer.stage(what, path, bytes); !s) return s;
  return writer.commit();
}

Status renamed(const Status& status, const std::string& option) {
  if (status.ok()) return status;
  const std::string& message = status.message();
  const std::string prefix = status.param() + ": ";
  if (!status.param().empty() && message.rfind(prefix, 0) == 0) return Status::Invalid(option, message.substr(prefix.size()));
  return Status::Invalid(option, message);
}

}  // namespace attn::tools
