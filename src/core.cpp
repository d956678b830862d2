// hivemesh::compiled: the non-template functions of the core, crypto, compression, tensor,
// DHT, averaging and progress headers, compiled once.
#include <hivemesh/averaging/impl/load_balancing.ipp>
#include <hivemesh/compression/impl/adaptive.ipp>
#include <hivemesh/compression/impl/codecs.ipp>
#include <hivemesh/compression/impl/compress.ipp>
#include <hivemesh/compression/impl/float16.ipp>
#include <hivemesh/core/impl/async.ipp>
#include <hivemesh/core/impl/file.ipp>
#include <hivemesh/crypto/impl/identity.ipp>
#include <hivemesh/crypto/impl/peer_id.ipp>
#include <hivemesh/crypto/impl/secure_channel.ipp>
#include <hivemesh/dht/impl/validator.ipp>
#include <hivemesh/progress/impl/record.ipp>
#include <hivemesh/tensor/impl/tensor.ipp>
