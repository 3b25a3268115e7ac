#!/usr/bin/env node
/*
 * A bagel lease client in JavaScript (Node 20), and a witness verifier an
 * auditor can read.
 *
 * It loads bagel's .proto files from proto/proto at run time with
 * @grpc/proto-loader (nothing generated is committed), then:
 *
 * 1. acquires a lease on two names in one request, verifies the witness
 *    signature (Node's own crypto, ed25519) over the exact body bytes the
 *    server sent, and only then decodes the body and checks that it states
 *    the grant: lease id, names and fencing tokens, deadline;
 * 2. renews it (a new witness, verified the same way), and shows what a
 *    rival gets: ABORTED, with the holder and when to retry in the standard
 *    `google.rpc.Status` of the `grpc-status-details-bin` trailer, decoded
 *    here as Status -> Any -> bagel.v1.LeaseConflict and google.rpc.RetryInfo;
 * 3. takes two more names and renews the first lease in one Batch call,
 *    whose three witnesses share one signature over a Merkle root, and
 *    verifies each on its own;
 * 4. releases everything.
 *
 *     (cd examples/js && npm ci)
 *     node examples/js/bagel_client.js --server 127.0.0.1:7420 --key <public key hex>
 *
 * `--key` is the server's public key as `bagel-server` prints it at start;
 * pin it out of band. Without it the example takes the key from ServerInfo,
 * which only shows that the witness came from whoever answered.
 *
 * The witness format (also in the README, "The witness format, for auditors
 * in any language"):
 *
 * - A lone witness (`batched == false`): `signature` is an ed25519 signature
 *   of "bagel.v1 witness\0" + body.
 * - A batched witness (`batched == true`): `signature` is an ed25519
 *   signature of "bagel.v1 witness batch root\0" + root, where root is
 *   computed from leaf = SHA-256(0x00 || body) by folding in `merkle_path`
 *   (leaf level first): at step i, if bit i of `leaf_index` is 0 the node is
 *   SHA-256(0x01 || node || sibling), else SHA-256(0x01 || sibling || node);
 *   after the last step the remaining `leaf_index` must be 0.
 * - `key_id` is the first 8 bytes of SHA-256(public key), as 16 hex digits.
 * - Never re-encode the body: protobuf encoding is not canonical.
 *
 * Any mismatch ends the run with a message on stderr and exit status 1.
 */

'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require('node:util');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
// proto-loader's own protobuf library (pinned to the version it resolves
// to): it decodes the messages that are no RPC's request or response, the
// signed witness bodies and the status details.
const protobuf = require('protobufjs');

const WITNESS_DOMAIN = Buffer.from('bagel.v1 witness\0', 'latin1');
const BATCH_ROOT_DOMAIN = Buffer.from('bagel.v1 witness batch root\0', 'latin1');
const LOCAL_TIME_DOMAIN = Buffer.from('bagel.v1 local time\0', 'latin1');

// DER SubjectPublicKeyInfo of an Ed25519 key (RFC 8410) up to the 32 raw
// key bytes: how Node's crypto takes a raw public key.
const ED25519_SPKI_PREFIX = Buffer.from('302a300506032b6570032100', 'hex');

const REPO = path.resolve(__dirname, '..', '..');
const PROTO_ROOT = path.join(REPO, 'proto', 'proto');

// The two messages of the gRPC richer error model this example reads, as
// googleapis defines them (google/rpc/status.proto, error_details.proto).
// They are not in this repository, and neither @grpc/grpc-js nor
// @grpc/proto-loader ships them.
const GOOGLE_RPC_PROTO = `
syntax = "proto3";
package google.rpc;
import "google/protobuf/any.proto";
import "google/protobuf/duration.proto";
message Status {
  int32 code = 1;
  string message = 2;
  repeated google.protobuf.Any details = 3;
}
message RetryInfo { google.protobuf.Duration retry_delay = 1; }
`;

const LEASE_CONFLICT_TYPE = 'bagel.v1.LeaseConflict';
const RETRY_INFO_TYPE = 'google.rpc.RetryInfo';

// uint64 as decimal strings, enums by name, bytes as Buffers, field names
// as in the .proto files: the same shape from gRPC calls and from decode().
const SHAPE = { longs: String, enums: String, bytes: Buffer, defaults: true, oneofs: true };

class WitnessError extends Error {}
class CheckError extends Error {}

function check(condition, what) {
  if (!condition) throw new CheckError(what);
}

function protoFiles(protoRoot = PROTO_ROOT) {
  const dir = path.join(protoRoot, 'bagel', 'v1');
  return fs
    .readdirSync(dir)
    .filter((f) => f.endsWith('.proto'))
    .sort()
    .map((f) => `bagel/v1/${f}`);
}

/** Loads bagel's .proto files: the gRPC client, and a decoder for bytes. */
function loadProtos(protoRoot = PROTO_ROOT) {
  const files = protoFiles(protoRoot);
  const definition = protoLoader.loadSync(files, { ...SHAPE, keepCase: true, includeDirs: [protoRoot] });
  const bagel = grpc.loadPackageDefinition(definition).bagel.v1;

  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) => path.join(protoRoot, target);
  // google/protobuf/* come bundled with protobufjs.
  root.loadSync(['google/protobuf/any.proto', 'google/protobuf/duration.proto', ...files], { keepCase: true });
  protobuf.parse(GOOGLE_RPC_PROTO, root, { keepCase: true });
  root.resolveAll();

  /** Decodes `bytes` as the message `typeName` (e.g. "bagel.v1.WitnessBody"). */
  function decode(typeName, bytes) {
    const type = root.lookupType(typeName);
    let message;
    try {
      message = type.decode(bytes);
    } catch (e) {
      throw new WitnessError(`bytes that do not decode as ${typeName}: ${e.message}`);
    }
    return type.toObject(message, SHAPE);
  }
  return { bagel, decode };
}

/** The id the server names its key by: SHA-256(key)[:8] in hex. */
function keyId(publicKey) {
  return crypto.createHash('sha256').update(publicKey).digest().subarray(0, 8).toString('hex');
}

function sha256(...parts) {
  const h = crypto.createHash('sha256');
  for (const p of parts) h.update(p);
  return h.digest();
}

const LEAF = Buffer.from([0x00]);
const NODE = Buffer.from([0x01]);

/** Folds a batched witness's body up its Merkle path to the root. */
function merkleRoot(body, leafIndex, merklePath) {
  let node = sha256(LEAF, body);
  let index = leafIndex;
  for (const sibling of merklePath) {
    if (sibling.length !== 32) throw new WitnessError(`merkle path entry of ${sibling.length} bytes, expected 32`);
    node = (index & 1) === 0 ? sha256(NODE, node, sibling) : sha256(NODE, sibling, node);
    index >>>= 1;
  }
  if (index !== 0) throw new WitnessError('leaf index beyond the merkle path');
  return node;
}

/** What a witness's signature covers (see the comment at the top). */
function signedMessage(witness) {
  if (!witness.batched) return Buffer.concat([WITNESS_DOMAIN, witness.body]);
  return Buffer.concat([BATCH_ROOT_DOMAIN, merkleRoot(witness.body, witness.leaf_index, witness.merkle_path)]);
}

/** An ed25519 verifier for a raw 32-byte public key. */
function publicKeyObject(raw) {
  return crypto.createPublicKey({ key: Buffer.concat([ED25519_SPKI_PREFIX, raw]), format: 'der', type: 'spki' });
}

function ed25519Verify(keyObject, message, signature) {
  try {
    return crypto.verify(null, message, keyObject, signature);
  } catch {
    return false; // a signature of the wrong length, say
  }
}

/**
 * Checks the signature over the body bytes as received, then decodes them.
 * `keys` maps key id to a Node public key object.
 */
function verifyWitness(witness, keys, decode) {
  const key = keys.get(witness.key_id);
  if (!key) throw new WitnessError(`unknown key id ${JSON.stringify(witness.key_id)}`);
  if (!ed25519Verify(key, signedMessage(witness), witness.signature)) throw new WitnessError('bad witness signature');
  return decode('bagel.v1.WitnessBody', witness.body);
}

/**
 * A local time agent's signed reading: ed25519 over
 * "bagel.v1 local time\0" + body. Returns { time_us, radius_us }.
 */
function verifyLocalTime(signedTime, keys, decode) {
  const local = signedTime && signedTime.local;
  if (!local) throw new WitnessError('a self-timed witness without a local time proof');
  const key = keys.get(local.key_id);
  if (!key) throw new WitnessError(`unknown key id ${JSON.stringify(local.key_id)} on the signed time`);
  if (!ed25519Verify(key, Buffer.concat([LOCAL_TIME_DOMAIN, local.body]), local.signature)) {
    throw new WitnessError('bad local time signature');
  }
  return decode('bagel.v1.LocalTimeBody', local.body);
}

/** A copy of `witness` changed by `tamper` must not verify. */
function mustNotVerify(witness, keys, decode, what, tamper) {
  const bad = { ...witness, merkle_path: witness.merkle_path.map((s) => Buffer.from(s)), body: Buffer.from(witness.body) };
  tamper(bad);
  try {
    verifyWitness(bad, keys, decode);
  } catch (e) {
    if (e instanceof WitnessError) return;
    throw e;
  }
  throw new CheckError(`a witness with ${what} verified`);
}

/**
 * The conflict and the retry delay (seconds) of a refused acquire.
 *
 * The `grpc-status-details-bin` trailer is a standard `google.rpc.Status`
 * (the gRPC richer error model): its `details` hold a
 * `bagel.v1.LeaseConflict` and a `google.rpc.RetryInfo` (the time until
 * the holder's deadline), each packed in a `google.protobuf.Any`.
 */
function conflictDetails(error, decode) {
  const raw = error.metadata && error.metadata.get('grpc-status-details-bin');
  check(raw && raw.length === 1 && Buffer.isBuffer(raw[0]), 'a conflict carries one grpc-status-details-bin trailer');
  const status = decode('google.rpc.Status', raw[0]);
  check(status.code === error.code, `the details' code ${status.code} is not the call's ${error.code}`);
  check(status.message === error.details, `the details' message ${JSON.stringify(status.message)} is not the call's`);
  let conflict = null;
  let retryAfterS = null;
  for (const any of status.details) {
    // An Any's type is the part of its URL after the last '/'.
    const type = any.type_url.slice(any.type_url.lastIndexOf('/') + 1);
    if (type === LEASE_CONFLICT_TYPE) {
      conflict = decode(LEASE_CONFLICT_TYPE, any.value);
    } else if (type === RETRY_INFO_TYPE) {
      const delay = decode(RETRY_INFO_TYPE, any.value).retry_delay;
      if (delay) retryAfterS = Number(delay.seconds) + delay.nanos / 1e9;
    }
  }
  check(conflict !== null, `details without a ${LEASE_CONFLICT_TYPE}: ${status.details.map((d) => d.type_url)}`);
  return { conflict, retryAfterS };
}

function nowUs() {
  return BigInt(Date.now()) * 1000n;
}

/** A unary call with a 10 s deadline, as a promise. */
function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + 10_000 }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

function sameNames(witnessNames, grantNames, wanted) {
  return (
    witnessNames.length === wanted.length &&
    grantNames.length === wanted.length &&
    wanted.every(
      (n, i) =>
        witnessNames[i].name === n &&
        grantNames[i].name === n &&
        witnessNames[i].fencing_token === grantNames[i].fencing_token,
    )
  );
}

/** Checks that a verified acquire witness states `grant`. */
function checkGrantWitness(body, grant, wanted, owner, serverId) {
  check(body.lease_id === grant.lease_id, `witness names lease ${body.lease_id}, the grant ${grant.lease_id}`);
  check(body.deadline_us === grant.deadline_us, `witness states deadline ${body.deadline_us}, the grant ${grant.deadline_us}`);
  check(body.min_timestamp_us === grant.min_timestamp_us, 'witness states another min timestamp');
  check(sameNames(body.names, grant.names, wanted), `witness names ${body.names.map((n) => n.name)}, not ${wanted}`);
  check(body.kind === 'WITNESS_KIND_ACQUIRE', `not an acquire witness: ${body.kind}`);
  check(body.owner === owner, `witness states owner ${JSON.stringify(body.owner)}`);
  check(body.server_id === serverId, `witness from server ${body.server_id}, not ${serverId}`);
}

async function run(server, pinnedKey, name) {
  const { bagel, decode } = loadProtos();
  const leases = new bagel.LeaseService(server, grpc.credentials.createInsecure());
  try {
    await runWith(leases, decode, pinnedKey, name);
  } finally {
    leases.close();
  }
}

async function runWith(leases, decode, pinnedKey, name) {
  const info = await unary(leases, 'ServerInfo', {});
  const keys = new Map();
  if (pinnedKey) {
    const key = Buffer.from(pinnedKey, 'hex');
    check(
      info.keys.some((k) => k.ed25519.equals(key)),
      `the server does not announce the pinned key ${pinnedKey} (it announces ${info.keys.map((k) => k.ed25519.toString('hex'))})`,
    );
    keys.set(keyId(key), publicKeyObject(key));
  } else {
    console.error('note: no --key given; trusting the key the server announces');
    for (const k of info.keys) {
      check(keyId(k.ed25519) === k.key_id, `key id ${k.key_id} does not match its key`);
      keys.set(k.key_id, publicKeyObject(k.ed25519));
    }
  }
  console.log(`server ${info.server_id} version ${info.version}, ready=${info.ready}, key ids [${[...keys.keys()].sort()}]`);

  // 1. Acquire two names at once.
  const ttlUs = 5_000_000n;
  const owner = 'js-example';
  const names = [`${name}-a`, `${name}-b`];
  const { grant } = await unary(leases, 'Acquire', { names, deadline_us: String(nowUs() + ttlUs), owner });
  let body = verifyWitness(grant.witness, keys, decode);
  checkGrantWitness(body, grant, names, owner, info.server_id);
  const tokens = body.names.map((n) => `${n.name}=${n.fencing_token}`).join(', ');
  const previous = body.names[0].previous;
  console.log(
    `acquired ${names.join(' and ')}: lease ${grant.lease_id}, fencing tokens ${tokens}, ` +
      `previous ended ${previous.ended} at watermark ${previous.watermark_us}, ` +
      `write after ${body.min_timestamp_us}, deadline ${body.deadline_us}; witness verified (key ${grant.witness.key_id})`,
  );
  if (body.self_timed) {
    const t = verifyLocalTime(body.signed_time, keys, decode);
    check(Math.abs(Number(BigInt(t.time_us) - BigInt(body.issued_at_us))) <= 10_000_000, 'signed time far from the issue time');
    console.log(`  signed time ${t.time_us} ± ${t.radius_us} us (the server's own clock, signed)`);
  }

  // A flipped byte must not verify.
  mustNotVerify(grant.witness, keys, decode, 'a flipped body byte', (w) => {
    w.body[0] ^= 1;
  });
  mustNotVerify(grant.witness, keys, decode, 'a flipped signature byte', (w) => {
    w.signature = Buffer.from(w.signature);
    w.signature[0] ^= 1;
  });

  // 2. Renew.
  const renewed = await unary(leases, 'Renew', {
    lease_id: grant.lease_id,
    token: grant.token,
    deadline_us: String(nowUs() + ttlUs),
  });
  body = verifyWitness(renewed.witness, keys, decode);
  check(body.kind === 'WITNESS_KIND_RENEW', `not a renew witness: ${body.kind}`);
  check(body.lease_id === grant.lease_id, 'renew witness names another lease');
  check(body.deadline_us === renewed.deadline_us, 'renew witness states another deadline');
  check(sameNames(body.names, grant.names, names), 'renew witness names other names');
  console.log(`renewed ${grant.lease_id} until ${renewed.deadline_us}; witness verified`);

  // A rival is refused; the details say who holds the name and until when.
  try {
    await unary(leases, 'Acquire', { names: [names[1]], deadline_us: String(nowUs() + ttlUs), owner: 'js-rival' });
    throw new CheckError('a held name was granted twice');
  } catch (e) {
    if (e instanceof CheckError) throw e;
    check(e.code === grpc.status.ABORTED, `a conflict is ABORTED, not ${grpc.status[e.code]} (${e.code}): ${e.details}`);
    const { conflict, retryAfterS } = conflictDetails(e, decode);
    check(conflict.name === names[1], `the conflict names ${conflict.name}, not ${names[1]}`);
    check(conflict.holder_lease_id === grant.lease_id, `the conflict names another holder: ${JSON.stringify(conflict)}`);
    check(conflict.holder_owner === owner, `the conflict names another owner: ${conflict.holder_owner}`);
    check(conflict.holder_deadline_us === renewed.deadline_us, 'the conflict states another deadline');
    const retry = retryAfterS === null ? 'no RetryInfo' : `retry in ${retryAfterS.toFixed(3)} s`;
    console.log(
      `a rival is refused (ABORTED: ${e.details}): ${conflict.name} held by lease ${conflict.holder_lease_id}, ` +
        `owner ${conflict.holder_owner}, mode ${conflict.holder_mode}, until ${conflict.holder_deadline_us}; ${retry}`,
    );
  }

  // 3. Two more names and a renew in one Batch: one signature over a Merkle
  // root of three witnesses (the leaf level padded to four).
  const batchNames = [`${name}-1`, `${name}-2`];
  const batch = await unary(leases, 'Batch', {
    ops: [
      ...batchNames.map((n) => ({ acquire: { names: [n], deadline_us: String(nowUs() + ttlUs), owner } })),
      { renew: { lease_id: grant.lease_id, token: grant.token, deadline_us: String(nowUs() + ttlUs) } },
    ],
  });
  check(batch.results.length === 3, `batch of 3 answered with ${batch.results.length} results`);
  const kinds = batch.results.map((r) => r.result);
  check(
    kinds.join() === 'grant,grant,renewed',
    `batch refused: ${JSON.stringify(batch.results.map((r) => r.error || r.result))}`,
  );
  const batchGrants = batch.results.slice(0, 2).map((r) => r.grant);
  const batchRenew = batch.results[2].renewed;
  const witnesses = [...batchGrants.map((g) => g.witness), batchRenew.witness];
  const roots = new Set();
  for (const [i, w] of witnesses.entries()) {
    check(w.batched, 'a batch of three is signed as one Merkle root');
    body = verifyWitness(w, keys, decode);
    roots.add(merkleRoot(w.body, w.leaf_index, w.merkle_path).toString('hex'));
    if (i < 2) {
      checkGrantWitness(body, batchGrants[i], [batchNames[i]], owner, info.server_id);
    } else {
      check(body.kind === 'WITNESS_KIND_RENEW', `not a renew witness: ${body.kind}`);
      check(body.lease_id === grant.lease_id, 'batched renew witness names another lease');
      check(body.deadline_us === batchRenew.deadline_us, 'batched renew witness states another deadline');
    }
    mustNotVerify(w, keys, decode, 'a flipped body byte', (bad) => {
      bad.body[0] ^= 1;
    });
    mustNotVerify(w, keys, decode, 'another leaf index', (bad) => {
      bad.leaf_index ^= 1;
    });
    mustNotVerify(w, keys, decode, 'a flipped merkle path byte', (bad) => {
      bad.merkle_path[0][3] ^= 1;
    });
    mustNotVerify(w, keys, decode, 'batched cleared', (bad) => {
      bad.batched = false;
    });
  }
  check(roots.size === 1, `the batch's witnesses fold to ${roots.size} roots, not one`);
  check(new Set(witnesses.map((w) => w.signature.toString('hex'))).size === 1, "the batch's witnesses carry several signatures");
  console.log(
    `batch: ${batchGrants.length} grants and a renew, one signature over root ${[...roots][0].slice(0, 16)}..., ` +
      `each witness verified alone (leaves ${witnesses.map((w) => w.leaf_index).join(', ')}; ` +
      `Merkle paths of ${witnesses[0].merkle_path.length} step(s))`,
  );

  // 4. Release everything (watermark 0: this example wrote nothing).
  for (const g of [grant, ...batchGrants]) {
    const released = await unary(leases, 'Release', { lease_id: g.lease_id, token: g.token });
    console.log(`released ${g.lease_id}; stored watermark ${released.watermark_us}`);
  }
}

const USAGE = `usage: node bagel_client.js [--server HOST:PORT] [--key HEX] [--name NAME]

  --server HOST:PORT  the lease server, also as http://HOST:PORT (default
                      $BAGEL_SERVER, as the bagel CLI reads it, or 127.0.0.1:7420)
  --key HEX           the server's ed25519 public key, 64 hex digits (pin it)
  --name NAME         the prefix of the names to lease (default js-example-PID)`;

async function main(argv) {
  let args;
  try {
    args = parseArgs({
      args: argv,
      options: {
        server: { type: 'string', default: process.env.BAGEL_SERVER || '127.0.0.1:7420' },
        key: { type: 'string' },
        name: { type: 'string', default: `js-example-${process.pid}` },
        help: { type: 'boolean', short: 'h' },
      },
    }).values;
  } catch (e) {
    console.error(`${e.message}\n${USAGE}`);
    return 2;
  }
  if (args.help) {
    console.log(USAGE);
    return 0;
  }
  if (args.key !== undefined && !/^[0-9a-fA-F]{64}$/.test(args.key)) {
    console.error(`--key must be 64 hex digits (a raw ed25519 public key), not ${JSON.stringify(args.key)}\n${USAGE}`);
    return 2;
  }
  try {
    args.server = args.server.replace(/^http:\/\//, '');
    await run(args.server, args.key && args.key.toLowerCase(), args.name);
  } catch (e) {
    if (e instanceof WitnessError || e instanceof CheckError) {
      console.error(`FAILED: ${e.message}`);
    } else if (e && typeof e.code === 'number' && e.details !== undefined) {
      console.error(`FAILED: gRPC ${grpc.status[e.code]} (${e.code}) from ${args.server}: ${e.details}`);
    } else {
      console.error('FAILED:', e);
    }
    return 1;
  }
  console.log('ok');
  return 0;
}

if (require.main === module) {
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
  });
}

module.exports = { keyId, merkleRoot, signedMessage, verifyWitness, verifyLocalTime, conflictDetails, loadProtos };
