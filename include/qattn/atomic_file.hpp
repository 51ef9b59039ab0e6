// Files that are either complete or absent: written to a hidden temporary name
// beside the target, then renamed over it (rename is atomic within a folder).
#pragma once
#include <functional>
#include <ostream>
#include <string>

namespace qattn {

// Calls write(stream) on ".<name>.tmp" beside path, then renames it to path.
// Throws std::runtime_error naming path when the file cannot be created or a
// write fails (disk full); the target is then left as it was.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write,
                           bool binary = false);

}  // namespace qattn
