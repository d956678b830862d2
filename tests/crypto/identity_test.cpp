#include "support/identities.hpp"

#include <hivemesh/crypto/identity.hpp>

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

using hivemesh::byte_buffer;
using hivemesh::byte_view;
using hivemesh::errc;
using hivemesh::crypto::identity;
using hivemesh::crypto::public_key;
using hivemesh::crypto::signature;
using hivemesh::crypto::verify;
namespace fs = std::filesystem;

namespace {

using hivemesh::test::seed_of;

byte_buffer from_hex(std::string_view hex) {
    byte_buffer out;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
        out.push_back(
            static_cast<std::byte>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
    return out;
}

/// A fresh directory under the system temp dir, removed with everything in it.
struct temporary_directory {
    fs::path path;
    temporary_directory() {
        std::string pattern = (fs::temp_directory_path() / "hivemesh-identity-XXXXXX").string();
        REQUIRE(::mkdtemp(pattern.data()) != nullptr);
        path = pattern;
    }
    temporary_directory(const temporary_directory&) = delete;
    temporary_directory& operator=(const temporary_directory&) = delete;
    ~temporary_directory() {
        std::error_code ignored;
        fs::remove_all(path, ignored);
    }
};

void write_file(const fs::path& path, const byte_buffer& bytes, fs::perms mode) {
    {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(bytes.data()),
                  static_cast<std::streamsize>(bytes.size()));
    }
    fs::permissions(path, mode);
}

byte_buffer read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> chars{std::istreambuf_iterator<char>(in),
                                  std::istreambuf_iterator<char>()};
    byte_buffer out(chars.size());
    std::transform(chars.begin(), chars.end(), out.begin(),
                   [](char c) { return static_cast<std::byte>(c); });
    return out;
}

unsigned file_mode(const fs::path& path) {
    struct stat status {};
    REQUIRE(::stat(path.c_str(), &status) == 0);
    return status.st_mode & 07777;
}

/// A valid identity file for `seed`, written by hand from the documented format.
byte_buffer identity_file(const byte_buffer& seed) {
    const auto pair = identity::from_seed(seed);
    byte_buffer bytes = {std::byte{'H'}, std::byte{'M'}, std::byte{'I'}, std::byte{'D'},
                         std::byte{1}};
    bytes.insert(bytes.end(), seed.begin(), seed.end());
    const auto key = pair.public_key().view();
    bytes.insert(bytes.end(), key.begin(), key.end());
    return bytes;
}

/// Restores the process umask when it goes out of scope.
struct umask_guard {
    mode_t previous;
    explicit umask_guard(mode_t mask)
        : previous(::umask(mask)) {}
    ~umask_guard() { ::umask(previous); }
};

} // namespace

TEST_CASE("an identity signs and its public key verifies", "[crypto][identity]") {
    const auto alice = identity::generate();
    const auto bob = identity::generate();
    REQUIRE(alice.public_key() != bob.public_key());
    CHECK(alice.id() == hivemesh::crypto::peer_id::from_public_key(alice.public_key().view()));
    CHECK(alice.id() == alice.public_key().id());

    const auto message = hivemesh::as_bytes("collaborative step 42");
    const signature sig = alice.sign(message);
    CHECK(verify(alice.public_key(), message, sig));
    CHECK_FALSE(verify(bob.public_key(), message, sig));
    // libsodium itself agrees: the signature is a standard detached Ed25519 signature.
    CHECK(crypto_sign_verify_detached(
              reinterpret_cast<const unsigned char*>(sig.bytes().data()),
              reinterpret_cast<const unsigned char*>(message.data()), message.size(),
              reinterpret_cast<const unsigned char*>(alice.public_key().bytes().data())) == 0);
    CHECK(alice.sign(byte_view{}) != sig);
    CHECK(verify(alice.public_key(), byte_view{}, alice.sign(byte_view{})));
}

TEST_CASE("from_seed is deterministic and matches RFC 8032", "[crypto][identity]") {
    // RFC 8032 section 7.1, TEST 1 (empty message).
    const auto seed = from_hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60");
    const auto expected_key =
        from_hex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
    const auto expected_signature =
        from_hex("e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bac"
                 "c61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b");
    const auto pair = identity::from_seed(seed);
    CHECK(pair.public_key() == *public_key::from_bytes(expected_key));
    CHECK(pair.sign(byte_view{}) == *signature::from_bytes(expected_signature));

    const auto again = identity::from_seed(seed);
    CHECK(again.public_key() == pair.public_key());
    CHECK(again.id() == pair.id());
    const auto message = hivemesh::as_bytes("same input, same signature");
    CHECK(again.sign(message) == pair.sign(message));
    CHECK(identity::from_seed(seed_of(7)).id() != pair.id());

    CHECK_THROWS_AS(identity::from_seed(byte_buffer(31)), std::system_error);
    CHECK_THROWS_AS(identity::from_seed(byte_buffer(33)), std::system_error);
}

TEST_CASE("tampered messages, signatures and keys do not verify", "[crypto][identity]") {
    const auto pair = identity::from_seed(seed_of(1));
    const auto text = std::string("a gradient summary worth signing");
    const signature sig = pair.sign(hivemesh::as_bytes(text));
    REQUIRE(verify(pair.public_key(), hivemesh::as_bytes(text), sig));

    for (std::size_t bit = 0; bit < text.size() * 8; ++bit) {
        auto tampered = text;
        tampered[bit / 8] = static_cast<char>(tampered[bit / 8] ^ (1 << (bit % 8)));
        CHECK_FALSE(verify(pair.public_key(), hivemesh::as_bytes(tampered), sig));
    }
    for (std::size_t bit = 0; bit < signature::size * 8; ++bit) {
        auto bytes = sig.bytes();
        bytes[bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
        CHECK_FALSE(verify(pair.public_key(), hivemesh::as_bytes(text), signature(bytes)));
    }
    for (std::size_t bit = 0; bit < public_key::size * 8; ++bit) {
        auto bytes = pair.public_key().bytes();
        bytes[bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
        CHECK_FALSE(verify(public_key(bytes), hivemesh::as_bytes(text), sig));
    }
    CHECK_FALSE(verify(public_key{}, hivemesh::as_bytes(text), sig));
    CHECK_FALSE(verify(pair.public_key(), hivemesh::as_bytes(text), signature{}));
    CHECK_FALSE(public_key::from_bytes(byte_buffer(31)));
    CHECK_FALSE(signature::from_bytes(byte_buffer(65)));
}

TEST_CASE("identities move and clone explicitly", "[crypto][identity]") {
    static_assert(!std::is_copy_constructible_v<identity>);
    static_assert(std::is_nothrow_move_constructible_v<identity>);
    auto original = identity::from_seed(seed_of(3));
    const auto id = original.id();
    const auto copy = original.clone();
    CHECK(copy.id() == id);
    identity moved = std::move(original);
    CHECK(moved.id() == id);
    CHECK(verify(moved.public_key(), byte_view{}, moved.sign(byte_view{})));
    CHECK_THROWS_AS(original.sign(byte_view{}),
                    std::logic_error); // NOLINT(bugprone-use-after-move)
}

TEST_CASE("an identity file is created 0600 and reloads to the same identity",
          "[crypto][identity]") {
    temporary_directory dir;
    const auto path = dir.path / "identity.key";
    // A permissive umask must not widen the mode: the file is born 0600.
    umask_guard open_umask(0);
    const auto created = identity::load_or_create(path);
    CHECK(file_mode(path) == 0600);
    const auto bytes = read_file(path);
    REQUIRE(bytes.size() == 69);
    CHECK(hivemesh::as_string_view(byte_view(bytes).first(4)) == "HMID");
    CHECK(bytes[4] == std::byte{1});
    CHECK(std::equal(bytes.begin() + 37, bytes.end(), created.public_key().view().begin()));
    // Nothing else (no temporary file) is left in the directory.
    CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);

    const auto reloaded = identity::load_or_create(path);
    CHECK(reloaded.id() == created.id());
    const auto message = hivemesh::as_bytes("persisted");
    CHECK(reloaded.sign(message) == created.sign(message));
    CHECK(read_file(path) == bytes);

    std::error_code ec;
    const auto third = identity::load_or_create(path, ec);
    REQUIRE_FALSE(ec);
    REQUIRE(third);
    CHECK(third->id() == created.id());

    // A file written by hand in the documented format loads to the identity of its seed.
    const auto hand_path = dir.path / "hand.key";
    write_file(hand_path, identity_file(seed_of(9)),
               fs::perms::owner_read | fs::perms::owner_write);
    CHECK(identity::load_or_create(hand_path).id() == identity::from_seed(seed_of(9)).id());
}

TEST_CASE("an identity file open to group or others is refused", "[crypto][identity]") {
    temporary_directory dir;
    const auto path = dir.path / "identity.key";
    const auto original = identity_file(seed_of(5));
    const fs::perms owner = fs::perms::owner_read | fs::perms::owner_write;
    for (const fs::perms extra :
         {fs::perms::group_read, fs::perms::group_write, fs::perms::group_exec,
          fs::perms::others_read, fs::perms::others_write, fs::perms::others_exec}) {
        write_file(path, original, owner | extra);
        std::error_code ec;
        CHECK_FALSE(identity::load_or_create(path, ec));
        CHECK(ec == errc::insecure_permissions);
        try {
            (void)identity::load_or_create(path);
            FAIL("load_or_create did not throw");
        } catch (const std::system_error& e) {
            CHECK(e.code() == errc::insecure_permissions);
        }
        CHECK(read_file(path) == original); // refused, not rewritten
    }
    write_file(path, original, owner);
    CHECK(identity::load_or_create(path).id() == identity::from_seed(seed_of(5)).id());
}

TEST_CASE("malformed identity files are refused", "[crypto][identity]") {
    temporary_directory dir;
    const auto path = dir.path / "identity.key";
    const fs::perms owner = fs::perms::owner_read | fs::perms::owner_write;
    const auto valid = identity_file(seed_of(6));

    const auto refused_with = [&](const byte_buffer& content) {
        write_file(path, content, owner);
        std::error_code ec;
        const auto loaded = identity::load_or_create(path, ec);
        CHECK_FALSE(loaded);
        CHECK(read_file(path) == content); // never overwritten
        return ec;
    };

    CHECK(refused_with({}) == errc::truncated_input);
    CHECK(refused_with(byte_buffer(valid.begin(), valid.end() - 1)) == errc::truncated_input);
    auto longer = valid;
    longer.push_back(std::byte{0});
    CHECK(refused_with(longer) == errc::trailing_data);
    auto bad_magic = valid;
    bad_magic[0] = std::byte{'X'};
    CHECK(refused_with(bad_magic) == errc::bad_magic);
    auto bad_version = valid;
    bad_version[4] = std::byte{2};
    CHECK(refused_with(bad_version) == errc::unsupported_version);
    auto flipped_seed = valid;
    flipped_seed[10] ^= std::byte{0x01};
    CHECK(refused_with(flipped_seed) == errc::corrupt_data);
    auto flipped_key = valid;
    flipped_key[60] ^= std::byte{0x80};
    CHECK(refused_with(flipped_key) == errc::corrupt_data);

    std::error_code ec;
    CHECK_FALSE(identity::load_or_create(dir.path, ec)); // a directory is not a key file
    CHECK(ec == errc::invalid_argument);

    const auto link = dir.path / "link.key";
    fs::create_symlink(path, link);
    CHECK_FALSE(identity::load_or_create(link, ec)); // symlinks are not followed
    CHECK(ec == std::errc::too_many_symbolic_link_levels);

    CHECK_FALSE(identity::load_or_create(dir.path / "missing" / "identity.key", ec));
    CHECK(ec == std::errc::no_such_file_or_directory);
    CHECK_THROWS_AS(identity::load_or_create(dir.path / "missing" / "identity.key"),
                    std::system_error);
}
