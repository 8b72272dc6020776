#include "campaign/clusters.h"

#include <stdexcept>

namespace gradfuzz::campaign {

std::string ClusterTable::key(const std::string& signature, bool attributable, const std::string& case_known) {
  std::string key = attributable ? signature : signature + "|persists-without-fault";
  if (!case_known.empty()) key += "|known:" + case_known;
  return key;
}

ClusterTable::Cluster* ClusterTable::find(const std::string& key) {
  for (auto& c : clusters_) {
    if (c.key == key) return &c;
  }
  return nullptr;
}

ClusterTable::Cluster& ClusterTable::add(Cluster cluster) {
  if (find(cluster.key)) throw std::logic_error("cluster '" + cluster.key + "' added twice");
  clusters_.push_back(std::move(cluster));
  return clusters_.back();
}

}  // namespace gradfuzz::campaign
