#include "distribute/nest.h"

namespace distribute::internal {

std::string_view nest_kind_name(NestKind kind) {
  switch (kind) {
    case NestKind::kLeaf: return "leaf";
    case NestKind::kList: return "list";
    case NestKind::kTuple: return "tuple";
    case NestKind::kDict: return "dict";
  }
  return "nest";
}

}  // namespace distribute::internal
