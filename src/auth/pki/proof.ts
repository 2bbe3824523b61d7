/**
 * A host's proof that it holds its key, for a renewal a Proxy carries (docs/pki.md, "Renewal of host
 * certificates"): the agent signs its host ID, cluster, the public key it asks for and the time with its private
 * key; the Auth Service checks the signature against the SSH public key recorded when the host joined, and the time
 * against its clock. A Proxy therefore cannot ask for a host that did not just ask itself: it would spend that
 * host's renewals. The same for a tunnel agent's presence through a Proxy (below). Pure: signing and checking, no I/O.
 */
import { createHash, sign, verify } from 'node:crypto';
import { loadPrivateKey } from './keys.js';
import { blobFromLine, keyFromBlob } from './sshwire.js';

/** How far the proof's time may be from the Auth Service's clock, either way. */
export const RENEW_PROOF_SKEW_MS = 5 * 60_000;

export interface RenewProof {
  /** RFC 3339, the agent's clock. */
  time: string;
  /** base64: the host key's signature (SHA-256) of proofText. */
  signature: string;
}

function proofText(hostId: string, cluster: string, publicKeyPem: string, time: string): Buffer {
  const key = createHash('sha256').update(publicKeyPem.trim()).digest('hex');
  return Buffer.from(`gateway host renewal v1\n${hostId}\n${cluster}\n${key}\n${time}\n`, 'utf8');
}

export function signRenewProof(privateKeyPem: string, hostId: string, cluster: string, publicKeyPem: string, now: number): RenewProof {
  const time = new Date(now).toISOString();
  return { time, signature: sign('sha256', proofText(hostId, cluster, publicKeyPem, time), loadPrivateKey(privateKeyPem, 'the host key')).toString('base64') };
}

/** Why a proof does not hold (missing, stale, or not signed by the recorded key), or undefined when it does. */
export function renewProofRefusal(proof: RenewProof | undefined, hostId: string, cluster: string, publicKeyPem: string, recordedSshKey: string, now: number): string | undefined {
  if (!proof || typeof proof.time !== 'string' || typeof proof.signature !== 'string') return 'the ask carries no proof that the host holds its key';
  const at = Date.parse(proof.time);
  if (!Number.isFinite(at) || Math.abs(now - at) > RENEW_PROOF_SKEW_MS) return `the proof's time (${proof.time.slice(0, 40)}) is more than ${RENEW_PROOF_SKEW_MS / 60_000} minutes from the Auth Service's clock`;
  try {
    const { key } = keyFromBlob(blobFromLine(recordedSshKey).blob);
    return verify('sha256', proofText(hostId, cluster, publicKeyPem, proof.time), key, Buffer.from(proof.signature, 'base64')) ? undefined : 'the proof is not signed by the key the host joined with';
  } catch {
    return 'the proof cannot be checked against the key the host joined with';
  }
}

/**
 * A tunnel agent's proof of its presence through one Proxy (docs/security.md, "Each member acts only for itself"):
 * the agent signs its host ID, cluster, the ID of the Proxy its tunnel reached, a digest of the services and
 * resources it announced in its hello, and the time, with the same key, every PRESENCE_PROOF_EVERY_MS while the
 * tunnel is up. A remote Auth Service checks it on each presence a Proxy writes, so that a Proxy cannot claim a
 * tunnel it does not hold, nor labels the agent did not announce. The same RenewProof shape.
 */
export const PRESENCE_PROOF_EVERY_MS = 60_000;

/** What a presence proof covers besides the host ID, cluster and time. */
export interface PresenceClaim {
  proxyId: string;
  services: unknown;
  resources: unknown;
}

/** JSON with object keys sorted at every level (arrays keep their order). */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    const entries = Object.entries(v as Record<string, unknown>).filter(([, x]) => x !== undefined).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, x]) => `${JSON.stringify(k)}:${canonical(x)}`).join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

/**
 * The digest of what an agent serves, as its hello announced it: the services (sorted) and the resources'
 * databases, apps, desktops, Kubernetes clusters (missing: none) and node labels. Not the SSH host certificate,
 * which renewal replaces during a tunnel and clients check against the host CA themselves.
 */
export function presenceDigest(services: unknown, resources: unknown): string {
  const r = (resources !== null && typeof resources === 'object' ? resources : {}) as Record<string, unknown>;
  const list = (v: unknown) => (Array.isArray(v) ? v : []);
  const served = Array.isArray(services) ? [...services].map(String).sort() : [];
  const body = { services: served, databases: list(r.databases), apps: list(r.apps), desktops: list(r.desktops), kube_clusters: list(r.kube_clusters), node_labels: r.node_labels ?? null };
  return createHash('sha256').update(canonical(body)).digest('hex');
}

function presenceText(hostId: string, cluster: string, claim: PresenceClaim, time: string): Buffer {
  return Buffer.from(`gateway presence v1\n${hostId}\n${cluster}\n${claim.proxyId}\n${presenceDigest(claim.services, claim.resources)}\n${time}\n`, 'utf8');
}

export function signPresenceProof(privateKeyPem: string, hostId: string, cluster: string, claim: PresenceClaim, now: number): RenewProof {
  const time = new Date(now).toISOString();
  return { time, signature: sign('sha256', presenceText(hostId, cluster, claim, time), loadPrivateKey(privateKeyPem, 'the host key')).toString('base64') };
}

/** Why a presence proof does not hold (missing, stale, or not signed by the recorded key for this claim), or undefined. */
export function presenceProofRefusal(proof: unknown, hostId: string, cluster: string, claim: PresenceClaim, recordedSshKey: string, now: number): string | undefined {
  const p = proof as Partial<RenewProof> | undefined;
  if (!p || typeof p !== 'object' || typeof p.time !== 'string' || typeof p.signature !== 'string' || p.time.length > 64 || p.signature.length > 1024) return 'no proof of the agent';
  const at = Date.parse(p.time);
  if (!Number.isFinite(at) || Math.abs(now - at) > RENEW_PROOF_SKEW_MS) return `the agent's proof is from ${p.time}, more than ${RENEW_PROOF_SKEW_MS / 60_000} minutes from the Auth Service's clock`;
  try {
    const { key } = keyFromBlob(blobFromLine(recordedSshKey).blob);
    return verify('sha256', presenceText(hostId, cluster, claim, p.time), key, Buffer.from(p.signature, 'base64')) ? undefined : 'the agent did not sign this presence (another Proxy, other services or resources, or another key)';
  } catch {
    return "the proof cannot be checked against the key the agent joined with";
  }
}
