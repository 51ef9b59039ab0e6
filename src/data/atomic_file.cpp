#include "qattn/atomic_file.hpp"

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace qattn {

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write,
                           bool binary) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".tmp");
  {
    std::ofstream f(tmp, std::ios::trunc | (binary ? std::ios::binary : std::ios::openmode{}));
    if (!f) throw std::runtime_error(path + ": cannot create " + tmp.string());
    write(f);
    f.flush();
    if (!f) {
      f.close();
      fs::remove(tmp);
      throw std::runtime_error(path + ": write failed (disk full?)");
    }
  }
  fs::rename(tmp, target);
}

}  // namespace qattn
