// Tests of nest.h: Nest<T> construction, flatten order (dict keys sorted),
// paths, pack_sequence_as, map, structure strings, structure assertions and
// Python-like printing.
#include "distribute/nest.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "distribute/tensor.h"
#include "testing/errors.h"

namespace distribute {
namespace {

using N = Nest<int>;

using testing::error_message;

// {'b': [1, 2], 'a': 0, 'c': (3, {'y': 5, 'x': 4})} given out of order.
N sample() { return N::dict({{"c", N::tuple({3, N::dict({{"y", 5}, {"x", 4}})})}, {"b", N::list({1, 2})}, {"a", 0}}); }

TEST(NestTest, KindsAndSizes) {
  N leaf = 7;
  EXPECT_EQ(leaf.kind(), NestKind::kLeaf);
  EXPECT_TRUE(leaf.is_leaf());
  EXPECT_EQ(leaf.leaf(), 7);
  EXPECT_EQ(leaf.size(), 1u);
  N empty;
  EXPECT_EQ(empty.kind(), NestKind::kList);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(N::tuple({1, 2, 3}).kind(), NestKind::kTuple);
  EXPECT_EQ(N::tuple({1, 2, 3}).size(), 3u);
  EXPECT_EQ(sample().kind(), NestKind::kDict);
  EXPECT_EQ(sample().size(), 3u);
  EXPECT_EQ(sample().kind_name(), "dict");
  EXPECT_EQ(N::list({}).kind_name(), "list");
  EXPECT_EQ(N::tuple({}).kind_name(), "tuple");
  EXPECT_EQ(leaf.kind_name(), "leaf");
}

TEST(NestTest, FlattenVisitsDictKeysInSortedOrder) {
  EXPECT_EQ(sample().flatten(), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(sample().num_leaves(), 6u);
  // Byte order, as Python sorts str keys: uppercase before lowercase.
  N d = N::dict({{"b", 1}, {"a", 2}, {"B", 3}, {"aa", 4}});
  EXPECT_EQ(d.flatten(), (std::vector<int>{3, 2, 4, 1}));
  EXPECT_EQ(d.dict_items()[0].first, "B");
  EXPECT_EQ(d.dict_items()[3].first, "b");
  EXPECT_EQ(N(5).flatten(), std::vector<int>{5});
  EXPECT_TRUE(N().flatten().empty());
  EXPECT_EQ(N::list({N::list({}), N::tuple({}), N::dict({})}).num_leaves(), 0u);
}

TEST(NestTest, FlattenPaths) {
  EXPECT_EQ(sample().flatten_paths(),
            (std::vector<std::string>{"['a']", "['b'][0]", "['b'][1]", "['c'][0]", "['c'][1]['x']", "['c'][1]['y']"}));
  EXPECT_EQ(N(1).flatten_paths(), std::vector<std::string>{""});
  EXPECT_EQ(N::list({N::list({9})}).flatten_paths(), std::vector<std::string>{"[0][0]"});
}

TEST(NestTest, ForEachLeafVisitsInFlattenOrder) {
  std::vector<int> seen;
  sample().for_each_leaf([&](int v) { seen.push_back(v * 10); });
  EXPECT_EQ(seen, (std::vector<int>{0, 10, 20, 30, 40, 50}));
}

TEST(NestTest, PackSequenceAsRebuildsTheStructure) {
  const N s = sample();
  N packed = N::pack_sequence_as(s, {10, 11, 12, 13, 14, 15});
  EXPECT_EQ(packed.structure_string(), s.structure_string());
  EXPECT_EQ(packed["a"].leaf(), 10);
  EXPECT_EQ(packed["b"][1].leaf(), 12);
  EXPECT_EQ(packed["c"][1]["y"].leaf(), 15);
  EXPECT_EQ(packed["c"].kind(), NestKind::kTuple);
  EXPECT_EQ(N::pack_sequence_as(s, s.flatten()), s);

  // Leaves of another type, and structure from another leaf type.
  Nest<std::string> named = Nest<std::string>::pack_sequence_as(N::list({1, N::tuple({2})}), {"x", "y"});
  EXPECT_EQ(named.flatten(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(named[1].kind(), NestKind::kTuple);
  EXPECT_EQ(named[1][0].leaf(), "y");
}

TEST(NestTest, PackSequenceAsChecksTheCount) {
  std::string msg = error_message<InvalidArgumentError>([] { N::pack_sequence_as(sample(), {1, 2, 3}); });
  EXPECT_NE(msg.find("6 leaves"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 values"), std::string::npos) << msg;
  EXPECT_THROW(N::pack_sequence_as(N(1), {1, 2}), InvalidArgumentError);
  EXPECT_THROW(N::pack_sequence_as(N(), {1}), InvalidArgumentError);
  EXPECT_EQ(N::pack_sequence_as(N(), {}), N());
}

TEST(NestTest, MapKeepsStructureAndMayChangeType) {
  Nest<std::string> m = sample().map([](int v) { return std::string(static_cast<std::size_t>(v), '*'); });
  EXPECT_EQ(m.structure_string(), sample().structure_string());
  EXPECT_EQ(m.flatten(), (std::vector<std::string>{"", "*", "**", "***", "****", "*****"}));
  EXPECT_EQ(m["c"].kind(), NestKind::kTuple);
  N doubled = sample().map([](int v) { return 2 * v; });
  EXPECT_EQ(doubled.flatten(), (std::vector<int>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(doubled["b"].kind(), NestKind::kList);
}

TEST(NestTest, StructureString) {
  EXPECT_EQ(sample().structure_string(), "{'a': *, 'b': [*, *], 'c': (*, {'x': *, 'y': *})}");
  EXPECT_EQ(N(1).structure_string(), "*");
  EXPECT_EQ(N::tuple({1}).structure_string(), "(*,)");
  EXPECT_EQ(N::tuple({}).structure_string(), "()");
  EXPECT_EQ(N().structure_string(), "[]");
  EXPECT_EQ(N::dict({}).structure_string(), "{}");
  // A quote or backslash in a key is escaped: no two structures print alike.
  const N quoted = N::dict({{"a': *, 'b", 1}, {"c", 2}});
  const N plain = N::dict({{"a", 1}, {"b': *, 'c", 2}});
  EXPECT_EQ(quoted.structure_string(), "{'a\\': *, \\'b': *, 'c': *}");
  EXPECT_NE(quoted.structure_string(), plain.structure_string());
  EXPECT_EQ(N::dict({{"x\\y", 1}}).structure_string(), "{'x\\\\y': *}");
}

TEST(NestTest, DuplicateDictKeyThrows) {
  const std::string msg = error_message<InvalidArgumentError>([] { N::dict({{"k", 1}, {"j", 2}, {"k", 3}}); });
  EXPECT_NE(msg.find("'k'"), std::string::npos) << msg;
  EXPECT_NO_THROW(N::dict({{"k", 1}, {"K", 2}}));
}

TEST(NestTest, IndexingErrors) {
  const N s = sample();
  EXPECT_EQ(s["b"][1].leaf(), 2);
  EXPECT_EQ(s[std::string("a")].leaf(), 0);
  std::string msg = error_message<NotFoundError>([&] { s["zz"]; });
  EXPECT_NE(msg.find("'zz'"), std::string::npos) << msg;
  msg = error_message<OutOfRangeError>([&] { s["b"][2]; });
  EXPECT_NE(msg.find("index 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("size 2"), std::string::npos) << msg;
  msg = error_message<InvalidArgumentError>([&] { s[1]; });  // a dict has no positions
  EXPECT_NE(msg.find("dict"), std::string::npos) << msg;
  msg = error_message<InvalidArgumentError>([&] { s["b"]["x"]; });  // a list has no keys
  EXPECT_NE(msg.find("list"), std::string::npos) << msg;
  EXPECT_EQ(s["b"][0].leaf(), 1);  // a literal 0 picks the index, not the const char* key
  EXPECT_EQ(s["b"][std::size_t{1}].leaf(), 2);
  msg = error_message<OutOfRangeError>([&] { s["b"][-1]; });
  EXPECT_NE(msg.find("-1"), std::string::npos) << msg;
  EXPECT_THROW(s["a"][1], InvalidArgumentError);  // a leaf has no children
  EXPECT_THROW(s["a"]["x"], InvalidArgumentError);
  EXPECT_THROW(s["b"].leaf(), InvalidArgumentError);  // a list is not a leaf
  EXPECT_THROW(N(1).items(), InvalidArgumentError);
  EXPECT_THROW(N(1).dict_items(), InvalidArgumentError);
  EXPECT_THROW(N::list({}).dict_items(), InvalidArgumentError);
}

TEST(NestTest, Equality) {
  EXPECT_EQ(sample(), sample());
  EXPECT_EQ(N::dict({{"a", 1}, {"b", 2}}), N::dict({{"b", 2}, {"a", 1}}));  // key order given is irrelevant
  EXPECT_NE(N::list({1, 2}), N::tuple({1, 2}));
  EXPECT_NE(N::list({1, 2}), N::list({1, 3}));
  EXPECT_NE(N::list({1}), N(1));
  EXPECT_NE(N::dict({{"a", 1}}), N::dict({{"b", 1}}));
}

// ---- assert_same_structure -----------------------------------------------------

TEST(AssertSameStructureTest, AcceptsSameStructureWithDifferentLeaves) {
  EXPECT_NO_THROW(assert_same_structure(sample(), sample().map([](int v) { return std::to_string(v); })));
  EXPECT_NO_THROW(assert_same_structure(N(1), N(2)));
  EXPECT_NO_THROW(assert_same_structure(N(), N::list({})));
}

TEST(AssertSameStructureTest, NamesThePathOfTheFirstDifference) {
  const N a = N::dict({{"a", 0}, {"b", N::list({1, 2})}});
  const N b = N::dict({{"a", 0}, {"b", N::list({1, N::list({2})})}});
  std::string msg = error_message<InvalidArgumentError>([&] { assert_same_structure(a, b); });
  EXPECT_NE(msg.find("['b'][1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("leaf"), std::string::npos) << msg;
  EXPECT_NE(msg.find("list"), std::string::npos) << msg;

  msg = error_message<InvalidArgumentError>([&] {
    assert_same_structure(a, N::dict({{"a", 0}, {"b", N::list({1, 2, 3})}}));
  });
  EXPECT_NE(msg.find("['b']"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 and 3"), std::string::npos) << msg;

  msg = error_message<InvalidArgumentError>([&] {
    assert_same_structure(a, N::dict({{"a", 0}, {"c", N::list({1, 2})}}));
  });
  EXPECT_NE(msg.find("'b'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'c'"), std::string::npos) << msg;

  msg = error_message<InvalidArgumentError>([&] { assert_same_structure(N::list({1}), N::tuple({1})); });
  EXPECT_NE(msg.find("the top level"), std::string::npos) << msg;

  msg = error_message<InvalidArgumentError>([&] {
    assert_same_structure(N::list({N::tuple({1, 2})}), N::list({N::tuple({1, N::dict({{"k", 2}})})}));
  });
  EXPECT_NE(msg.find("[0][1]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dict"), std::string::npos) << msg;
}

// ---- printing -------------------------------------------------------------------

TEST(NestReprTest, PythonLikePrinting) {
  EXPECT_EQ(repr(N::list({1, 2})), "[1, 2]");
  EXPECT_EQ(repr(N::tuple({1, 2})), "(1, 2)");
  EXPECT_EQ(repr(N::tuple({1})), "(1,)");
  EXPECT_EQ(repr(N::tuple({})), "()");
  EXPECT_EQ(repr(N()), "[]");
  EXPECT_EQ(repr(N::dict({})), "{}");
  EXPECT_EQ(repr(N(3)), "3");
  EXPECT_EQ(repr(sample()), "{'a': 0, 'b': [1, 2], 'c': (3, {'x': 4, 'y': 5})}");
  std::ostringstream os;
  os << N::list({N::tuple({7})});
  EXPECT_EQ(os.str(), "[(7,)]");
}

TEST(NestReprTest, TensorLeavesUseTheirRepr) {
  using TN = Nest<Tensor>;
  TN n = TN::dict({{"x", constant(1)}, {"y", TN::tuple({constant(2.0f)})}});
  EXPECT_EQ(repr(n),
            "{'x': <tf.Tensor: shape=(), dtype=int32, numpy=1>, "
            "'y': (<tf.Tensor: shape=(), dtype=float32, numpy=2.0>,)}");
  EXPECT_EQ(n.flatten().size(), 2u);
  EXPECT_EQ(n.flatten()[1], constant(2.0f));
}

// A nest may be kMaxDepth levels deep; one level more is refused as it is
// built, so a nest 100,000 levels deep is an error, not a stack overflow in
// a replica thread's recursive walk (or in its destructor).
TEST(NestTest, NestingPastTheLimitIsRefused) {
  using IntNest = Nest<int>;
  IntNest deep = IntNest(1);
  for (std::size_t d = 0; d < IntNest::kMaxDepth; ++d) {
    deep = (d % 3 == 0) ? IntNest::list({deep}) : IntNest::tuple({deep, 2});
  }
  EXPECT_EQ(deep.depth(), IntNest::kMaxDepth);
  EXPECT_EQ(deep.num_leaves(), 1 + 2 * (IntNest::kMaxDepth / 3));
  std::string msg;
  try {
    IntNest::dict({{"x", deep}});
  } catch (const InvalidArgumentError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("more than 1000 levels"), std::string::npos) << msg;
  EXPECT_THROW(IntNest::list({deep}), InvalidArgumentError);
  // Building towards 100,000 levels stops at the limit.
  IntNest built = IntNest(0);
  std::size_t levels = 0;
  try {
    for (; levels < 100000; ++levels) built = IntNest::list({built});
  } catch (const InvalidArgumentError&) {
  }
  EXPECT_EQ(levels, IntNest::kMaxDepth);
  EXPECT_EQ(IntNest().depth(), 1u);
  EXPECT_EQ(IntNest(3).depth(), 0u);
}

}  // namespace
}  // namespace distribute
