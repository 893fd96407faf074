// attn tools: the rules for the files a command reads and writes, in one place.
//
// Outputs: a command names its output files (--out, --lse, --png, ...) and its input files (--q, --mask,
// ...) to check_outputs() before it reads or computes anything. An output must be a non-empty path in an
// existing directory that either does not exist yet or is a writable regular file (checked with lstat, so a
// FIFO, device, directory, socket or symbolic link is refused rather than replaced), must not be the same file as
// any input (same path after canonicalisation, or the same device and inode: a hard link), and must differ
// from every other output.
//
// Writing: FileWriter writes every output to a new temporary file in its directory (".attn-tmp.<pid>.<n>",
// created exclusively, flushed to disk) and only when all of them are written renames them into place, so on any error no output file is
// created or changed. write_file() does the same for one file.
//
// Inputs are read by npy::read (tools/npy.h), which opens the file, fstats the open descriptor and refuses
// anything that is not a regular file.
//
// Every error is a Status "<option>: <what was found>; expected <what>".
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "attn/status.h"

namespace attn::tools {

// An option naming a file, e.g. {"--out", "o.npy"}. An empty path means the option was not given, which
// for a `required` output is an error.
struct FileArg {
  std::string option;
  std::string path;
  bool required = false;
};

// "a FIFO", "a character device", "a block device", "a directory", "a socket", "a symbolic link" (or "a
// special file") for an st_mode that is not a regular file; nullptr for a regular file.
const char* special_file_kind(mode_t mode);

// The checks above for every output with a non-empty path (an empty required one is refused). Inputs with an empty path are ignored; an input
// that does not exist is compared by path only (reading it will report it).
Status check_outputs(const std::vector<FileArg>& outputs, const std::vector<FileArg>& inputs);

// All-or-nothing writing of several files. stage() writes the bytes of one file to a temporary file in the
// destination's directory; commit() checks that no destination has become something other than a new or
// regular file, then renames every temporary over its destination. Temporaries not committed (after an
// error, or when the writer is destroyed without commit()) are removed.
class FileWriter {
 public:
  FileWriter() = default;
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  ~FileWriter();

  // `what` names the file in error messages (an option such as "--out", or the path itself).
  Status stage(const std::string& what, const std::string& path, std::string_view bytes);
  Status commit();

 private:
  struct Staged {
    std::string what, path, tmp;
  };
  void discard();
  std::vector<Staged> staged_;
};

// One file through a FileWriter.
Status write_file(const std::string& what, const std::string& path, std::string_view bytes);

// `status` with its parameter name replaced by `option` ("png: ..." -> "--png: ..."); an ok Status and a
// message without the "<param>: " prefix pass through (the latter prefixed with the option).
Status renamed(const Status& status, const std::string& option);

}  // namespace attn::tools
