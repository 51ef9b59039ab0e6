#include "qattn/atomic_file.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace qattn {

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write,
                           bool binary) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::error_code ec;
  if (fs::is_directory(target, ec))
    throw std::runtime_error(path + ": is a directory; allowed: a file path (the file is replaced)");
  const fs::path folder = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".tmp");
  std::ofstream f(tmp, std::ios::trunc | (binary ? std::ios::binary : std::ios::openmode{}));
  if (!f) throw std::runtime_error(path + ": cannot create a file in " + folder.string() + ": " + std::strerror(errno));
  // From here on every failure removes the temporary: a failed write leaves the folder as it was.
  try {
    errno = 0;
    write(f);
    f.close();
    if (!f)
      throw std::runtime_error(path + ": write failed: " + (errno ? std::strerror(errno) : "stream error") +
                               " (disk full?)");
    fs::rename(tmp, target, ec);
    if (ec) throw std::runtime_error(path + ": cannot replace it: " + ec.message());
  } catch (...) {
    if (f.is_open()) f.close();
    fs::remove(tmp, ec);
    throw;
  }
}

}  // namespace qattn
