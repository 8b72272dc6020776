#include "campaign/clusters.h"

#include <stdexcept>

namespace gradfuzz::campaign {

std::string ClusterTable::key(const std::string& signature, bool attributable) {
  return attributable ? signature : signature + "|persists-without-fault";
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
