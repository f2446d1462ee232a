// dcr keys SCENARIO.yaml -o DIR: the credentials of one deployment (mutual TLS on the relay
// tree): a fresh, unpredictable deployment id (the file "deployment": 16 hex digits), a fresh CA
// and one certificate per rank, named by the deployment id and the rank's role in the scenario's
// tree (dcr://<id>/<role>/<rank>), and the trainer's signing key pair (trainer.key,
// trainer.pub). Hand each host its node-<rank>.crt / .key, ca.crt, trainer.pub and deployment;
// trainer.key only to the trainer; ca.key stays here. Without a scenario: the deployment id and
// the signing key pair. Nothing is ever overwritten: new credentials are a new deployment, in a
// new directory; `--renew` re-issues the node certificates of the deployment in DIR (all ranks
// of the scenario, added ranks included) under its CA and id, while the CA is valid.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "dcr/relay_policy.h"
#include "dcr/scenario.h"
#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "transport/tls.h"

namespace dcr::cli {
namespace {

struct KeysArgs {
  std::string scenario;
  std::string out;
  int days = 30;
  bool renew = false;
};

// The trainer's signing key pair in `dir` (trainer.key 0600, trainer.pub).
Status WriteTrainerKey(const std::string& dir) {
  DCR_ASSIGN_OR_RETURN(auto key, SigningKey::Generate());
  DCR_RETURN_IF_ERROR(key->Write(dir + "/trainer.key", dir + "/trainer.pub"));
  std::fprintf(stderr,
               "dcr keys: trainer signing key %s in %s/trainer.key (0600), public key "
               "%s/trainer.pub\n",
               KeyFingerprint(key->public_key()).c_str(), dir.c_str(), dir.c_str());
  return Status();
}

// A fresh deployment id in `dir`/deployment (0644; never overwritten).
StatusOr<std::string> WriteDeploymentId(const std::string& dir) {
  DCR_ASSIGN_OR_RETURN(const std::string id, internal::NewRunId());
  const std::string path = dir + "/deployment";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) {
      return FailedPreconditionError(path +
                                     " exists: credentials are never overwritten (new "
                                     "credentials are a new deployment: give a new directory)");
    }
    return ErrnoError("create " + path, errno);
  }
  const std::string text = id + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  const int err = errno;
  if (::close(fd) != 0 || !ok) {
    ::unlink(path.c_str());
    return ErrnoError("write " + path, ok ? errno : err);
  }
  return id;
}

// Refuses, before anything is written, a directory that already holds one of the files a new
// deployment makes (`names`, in `dir`): `dcr keys` never overwrites credentials, and a refusal
// half-way would leave a deployment id or CA without the rest. kFailedPrecondition naming the
// first one found.
Status RefuseExisting(const std::string& dir, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    struct stat st;
    const std::string path = dir + "/" + name;
    if (::lstat(path.c_str(), &st) == 0) {
      return FailedPreconditionError(
          path +
          " exists: `dcr keys` never overwrites credentials (a new deployment goes in an "
          "empty directory; --renew re-issues node certificates in place)");
    }
    if (errno != ENOENT) return ErrnoError(path, errno);
  }
  return Status();
}

// What `dcr keys` makes in its directory: the deployment id and the trainer's key pair, and with
// a scenario the CA and one certificate and key per rank.
std::vector<std::string> DeploymentFiles(size_t ranks) {
  std::vector<std::string> names = {"deployment", "trainer.key", "trainer.pub"};
  if (ranks > 0) {
    names.push_back("ca.key");
    names.push_back("ca.crt");
  }
  for (size_t r = 0; r < ranks; ++r) {
    names.push_back("node-" + std::to_string(r) + ".key");
    names.push_back("node-" + std::to_string(r) + ".crt");
  }
  return names;
}

// --renew: fresh node certificates for every rank of the scenario's tree under the CA and
// deployment id already in `a.out` (renewal before expiry, or ranks added to the tree); the CA,
// the deployment id and the trainer's key stay.
Status Renew(const KeysArgs& a, const std::vector<std::string>& roles) {
  DCR_RETURN_IF_ERROR(internal::PrepareCredentialDir(a.out));
  std::ifstream in(a.out + "/deployment");
  std::string id;
  if (!(in >> id)) {
    return NotFoundError(a.out +
                         "/deployment: no deployment to renew (make one with `dcr keys "
                         "SCENARIO -o DIR`)");
  }
  DCR_ASSIGN_OR_RETURN(const std::string cert_id,
                       internal::CertificateRunId(a.out + "/node-0.crt"));
  if (cert_id != id) {
    return FailedPreconditionError(a.out + "/node-0.crt is of deployment " + cert_id + ", not " +
                                   a.out + "/deployment's " + id);
  }
  for (size_t r = 0; r < roles.size(); ++r) {
    const std::string rank = std::to_string(r);
    DCR_RETURN_IF_ERROR(internal::WriteExtraCredential(a.out, roles[r], static_cast<int>(r),
                                                       "node-" + rank, a.days));
  }
  std::fprintf(stderr,
               "dcr keys: deployment %s: %zu node certificates renewed in %s under its CA (valid "
               "%d days, and no longer than the CA)\n",
               id.c_str(), roles.size(), a.out.c_str(), a.days);
  return Status();
}

Status KeysMain(const KeysArgs& a) {
  if (a.renew) {
    if (a.scenario.empty()) return InvalidArgumentError("--renew: give the scenario (its ranks)");
    DCR_ASSIGN_OR_RETURN(Scenario s, LoadScenario(a.scenario));
    DCR_ASSIGN_OR_RETURN(Topology topo, TopologyFor(s));
    return Renew(a, internal::TreeRoles(topo.parent));
  }
  if (a.scenario.empty()) {
    DCR_RETURN_IF_ERROR(internal::PrepareCredentialDir(a.out));
    DCR_RETURN_IF_ERROR(RefuseExisting(a.out, DeploymentFiles(0)));
    DCR_ASSIGN_OR_RETURN(const std::string id, WriteDeploymentId(a.out));
    std::fprintf(stderr, "dcr keys: deployment %s (%s/deployment)\n", id.c_str(), a.out.c_str());
    return WriteTrainerKey(a.out);
  }
  DCR_ASSIGN_OR_RETURN(Scenario s, LoadScenario(a.scenario));
  DCR_ASSIGN_OR_RETURN(Topology topo, TopologyFor(s));
  DCR_RETURN_IF_ERROR(internal::PrepareCredentialDir(a.out));
  const std::vector<std::string> roles = internal::TreeRoles(topo.parent);
  DCR_RETURN_IF_ERROR(RefuseExisting(a.out, DeploymentFiles(roles.size())));
  DCR_ASSIGN_OR_RETURN(const std::string run_id, WriteDeploymentId(a.out));
  DCR_RETURN_IF_ERROR(internal::WriteRunCredentials(a.out, run_id, roles, a.days,
                                                    /*replace=*/false));
  std::fprintf(stderr,
               "dcr keys: deployment %s (%s/deployment): CA and %zu node certificates in %s "
               "(keys 0600)\n",
               run_id.c_str(), a.out.c_str(), roles.size(), a.out.c_str());
  DCR_RETURN_IF_ERROR(WriteTrainerKey(a.out));
  std::printf(
      "# Add to the scenario (network:); copy ca.crt and node-<rank>.crt/.key to host <rank>,\n"
      "# keep ca.key off the hosts; trainer.key goes only to rank 0, trainer.pub and deployment\n"
      "# (side by side) to every host.\n"
      "  tls:\n    ca: %s/ca.crt\n    cert: %s/node-{rank}.crt\n    key: %s/node-{rank}.key\n"
      "  signing:\n    key: %s/trainer.key\n    trust: %s/trainer.pub\n",
      a.out.c_str(), a.out.c_str(), a.out.c_str(), a.out.c_str(), a.out.c_str());
  return Status();
}

}  // namespace

DCR_REGISTER_COMMAND(
    "keys",
    "Make the credentials of one deployment: a fresh deployment id (-o DIR: deployment), a fresh "
    "CA and one certificate per rank of the scenario's relay tree naming it (ca.crt, ca.key, "
    "node-<rank>.crt, node-<rank>.key) and the trainer's Ed25519 signing key (trainer.key, "
    "trainer.pub); keys 0600, never overwritten; prints the scenario keys",
    [](CLI::App* app) {
      auto a = std::make_shared<KeysArgs>();
      app->add_option("scenario", a->scenario,
                      "Scenario YAML file (its tree shape); without it only the trainer's "
                      "signing key is made");
      app->add_option("-o,--out", a->out, "Directory for the credentials (created 0700)")
          ->required();
      app->add_option("--days", a->days, "Validity of the certificates in days (default 30)")
          ->check(CLI::Range(1, 3650));
      app->add_flag("--renew", a->renew,
                    "Renew the node certificates of an existing deployment in -o DIR (every rank "
                    "of the scenario, ranks added to it included) under its CA and deployment id; "
                    "the CA and the trainer's key stay");
      return [a]() { return ReportStatus("keys", KeysMain(*a)); };
    });

}  // namespace dcr::cli
