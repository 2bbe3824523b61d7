/**
 * A host's proof that it holds its key, for a renewal a Proxy carries (docs/pki.md, "Renewal of host
 * certificates"): the agent signs its host ID, cluster, the public key it asks for and the time with its private
 * key; the Auth Service checks the signature against the SSH public key recorded when the host joined, and the time
 * against its clock. A Proxy therefore cannot ask for a host that did not just ask itself: it would spend that
 * host's renewals. Pure: signing and checking, no I/O.
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
