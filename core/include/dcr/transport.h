// Real transport drivers' shared pieces: the full-checkpoint reference stream (its blobs and its
// receivers). The node process that runs the relay policies over sockets or an object store is
// in dcr/node.h.
//
// Thread safety: FullStreamBlobs is self-contained; a receiver from MakeFullReceiver is called as
// receiver.h allows.
#ifndef DCR_CORE_INCLUDE_DCR_TRANSPORT_H_
#define DCR_CORE_INCLUDE_DCR_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dcr/receiver.h"
#include "dcr/relay_policy.h"
#include "dcr/status.h"

namespace dcr {

class Device;  // dcr/device.h

// A receiver of the full-checkpoint reference stream (FullStreamBlobs): rebuilds the file image
// from its slices (records are slices; the trailer's file checksum proves it). The stream carries
// no version: held() is {0, zero hash} and MissingChunks is empty.
std::unique_ptr<Receiver> MakeFullReceiver();
// The same stream received onto `device` (dcr/device.h), as a serving process loads a full
// checkpoint onto its GPU: Begin refuses a file the device cannot hold (one allocation of the
// file's size, freed at once: kResourceExhausted before any slice); the image is rebuilt in host
// memory, and Commit, after the file checksum, loads its tensors into device memory
// (MakeDeviceReceiver) and frees the image; Verify compares on the device. Errors of Commit also
// MakeDeviceReceiver's. REQUIRES: device != nullptr.
std::unique_ptr<Receiver> MakeFullReceiver(std::shared_ptr<Device> device);

// Cuts a checkpoint file into the blobs of the full-checkpoint reference stream: header =
// u64 file size + the safetensors header bytes; chunks = u64 file offset + up to slice_bytes of
// the data section; trailer = u64 file size + u64 number of chunks + u64 XXH3-64 of the file.
// `emit` is called for each blob in order. Errors: I/O, or those of `emit`; kInvalidArgument for
// a sharded checkpoint (the stream carries one file image), before anything is emitted.
Status FullStreamBlobs(const std::string& path, uint64_t slice_bytes,
                       const std::function<Status(BlobKind, std::vector<uint8_t>)>& emit);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_TRANSPORT_H_
