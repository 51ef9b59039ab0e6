// Files that are either complete or absent: written to a hidden temporary name
// beside the target, then renamed over it (rename is atomic within a folder).
#pragma once
#include <functional>
#include <ostream>
#include <string>

namespace qattn {

// Calls write(stream) on ".<name>.tmp" beside path, then renames it to path.
// Throws std::runtime_error naming path and the reason (the OS's words) when
// path is a directory, the file cannot be created, a write fails (disk full)
// or the rename fails; whatever fails, and also when write() throws, the
// temporary is removed and the target is left as it was.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write,
                           bool binary = false);

}  // namespace qattn
