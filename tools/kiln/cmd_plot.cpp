// kiln plot -o FILE.png RUN.json...: the best-so-far curves of saved tunings.
#include <fstream>

#include <fmt/format.h>

#include "commands.hpp"
#include "core/format.hpp"
#include "kiln/error.hpp"
#include "plot.hpp"

namespace kiln::cli {

void add_plot(CLI::App& app, Globals&) {
  auto* cmd = app.add_subcommand(
      "plot", "Draw best time so far against configs timed, from saved kiln tune --json outputs, into a PNG (PLplot)");
  auto files = std::make_shared<std::vector<std::string>>();
  auto png = std::make_shared<std::string>();
  auto title = std::make_shared<std::string>();
  cmd->add_option("runs", *files, "kiln tune --json outputs, one curve each (e.g. --effort quick and --effort full)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", *png, "The picture to write (.png)")->required();
  cmd->add_option("--title", *title, "The picture's title (default: the kernel and its key)");
  cmd->callback([files, png, title] {
    std::string why;
    if (!can_plot(&why)) fail(Errc::usage, "cannot draw: {}", why);
    std::vector<SearchCurve> curves;
    std::string heading = *title;
    for (const auto& f : *files) {
      std::ifstream in(f);
      nlohmann::ordered_json j;
      try {
        j = nlohmann::ordered_json::parse(in);
        if (!j.is_object() || !j.contains("configs") || !j.contains("method"))
          fail(Errc::usage, "{} is not the output of kiln tune --json (no configs or method)", f);
        if (heading.empty()) {
          std::string key;
          for (const auto& [n, v] : j["key"].items()) key += (key.empty() ? "" : " ") + n + "=" + v.dump();
          std::string device = j.value("device", "?");
          device = device.substr(0, device.find(" ("));  // without the feature-flags hash
          heading = fmt::format("{} at {} ({})", j.value("kernel", "?"), key, device);
        }
        curves.push_back(curve_of_tuning(j, std::filesystem::path(f).stem().string() + ": "));
      } catch (const nlohmann::json::exception& e) {
        fail(Errc::usage, "{} is not the output of kiln tune --json: {}", f, e.what());
      }
    }
    plot_search(*png, heading, curves);
    std::fprintf(out(), "wrote %s (%zu curve%s)\n", png->c_str(), curves.size(), curves.size() == 1 ? "" : "s");
  });
}

}  // namespace kiln::cli
