// A main() for the fuzz harnesses where libFuzzer is not linked (builds without
// EXPANSE_ENABLE_FUZZ, e.g. with gcc): runs LLVMFuzzerTestOneInput once on each file named, and on
// each file of each directory named, so that every build replays the corpus as a test.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <dirent.h>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool is_dir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!arg.empty() && arg[0] == '-') continue;  // libFuzzer flags: ignored
    if (!is_dir(arg)) {
      files.push_back(arg);
      continue;
    }
    DIR* dir = opendir(arg.c_str());
    if (!dir) {
      std::fprintf(stderr, "cannot open directory %s\n", arg.c_str());
      return 1;
    }
    std::vector<std::string> names;
    while (const dirent* e = readdir(dir))
      if (e->d_name[0] != '.') names.push_back(arg + "/" + e->d_name);
    closedir(dir);
    std::sort(names.begin(), names.end());
    files.insert(files.end(), names.begin(), names.end());
  }
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", f.c_str());
      return 1;
    }
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::printf("running %s (%zu bytes)\n", f.c_str(), bytes.size());
    std::fflush(stdout);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("%zu inputs ran\n", files.size());
  return files.empty() ? 1 : 0;
}
