// State sharing: peers that hold the training state (parameters, optimizer state and opaque
// metadata such as the epoch) advertise themselves as donors in the DHT, and a newcomer
// downloads the state from the best of them as a chunked, hash-verified stream, falling back
// to the next donor when a download fails.
//
// DHT: key "<prefix>_state_donors" is a dictionary; subkey = the donor's owner marker
// "[owner:<base58 Ed25519 public key>]", so only the donor can write or withdraw its record
// (the DHT checks the signature); value = a donor_record (priority, listen address without a
// PeerId). Readers take the donor's PeerId from the marker's key, and the download's dial
// checks it. A donor refreshes its record while it serves; on stop it stores an empty value
// (a tombstone) with a later expiration, which readers skip, so it disappears at once instead
// of when its record would have expired.
//
// RPC: one streaming call "<prefix>.state". The newcomer sends a state_request and closes
// its side; the donor answers with a state_header (metadata, tensor sizes, chunk geometry
// and the BLAKE2b-256 hash of every chunk's payload), then every chunk in order. The
// newcomer checks each chunk against the header as it arrives (a mismatch is corrupt_data
// at once) and, once all have arrived, has verified the whole state. The wire formats are
// documented beside their encoders and in docs/architecture.md ("State sharing").
//
// Threading: as the RPC and DHT nodes: everything runs on their executor. The asynchronous
// API may be called from any thread; state_server's other members on the executor or while
// it does not run. The blocking load_state() must not be called on an io thread.
#pragma once

#include "hivemesh/averaging/state_loading.hpp"
#include "hivemesh/averaging/state_server.hpp"
#include "hivemesh/averaging/state_wire.hpp"
