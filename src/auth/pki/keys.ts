/**
 * Key pairs: ECDSA P-256 everywhere (TLS and SSH, CA and leaf), PEM PKCS#8 / SPKI plus the OpenSSH public
 * key line. Loading helpers turn every parse failure into GW_ERR_PKI_BAD_KEY without ever putting key text
 * in a message.
 */
import { createPrivateKey, createPublicKey, generateKeyPairSync, type KeyObject } from 'node:crypto';
import { GatewayError } from '../../errors.js';
import { redactSecrets } from '../../redact.js';
import { lineFromBlob, sshBlobFromKey } from './sshwire.js';

export interface KeyPair {
  /** PKCS#8 PEM ("-----BEGIN PRIVATE KEY-----"). */
  privateKeyPem: string;
  /** SPKI PEM ("-----BEGIN PUBLIC KEY-----"). */
  publicKeyPem: string;
  /** One line: "ecdsa-sha2-nistp256 AAAA..." (no comment). */
  sshPublicKey: string;
}

/** A fresh ECDSA P-256 key pair: usable for TLS and for SSH (ecdsa-sha2-nistp256). */
export function generateKeyPair(): KeyPair {
  const { privateKey, publicKey } = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
  return {
    privateKeyPem: privateKey.export({ type: 'pkcs8', format: 'pem' }) as string,
    publicKeyPem: publicKey.export({ type: 'spki', format: 'pem' }) as string,
    sshPublicKey: lineFromBlob(sshBlobFromKey(publicKey)),
  };
}

/** The reason a key failed to load, with the key text itself redacted (messages never carry key material). */
function reason(err: unknown, input: string | Buffer): string {
  const message = err instanceof Error ? err.message : String(err);
  return redactSecrets(message, typeof input === 'string' ? [input] : [input.toString('latin1')]);
}

export function loadPrivateKey(pem: string, what: string): KeyObject {
  try {
    return createPrivateKey({ key: pem, format: 'pem' });
  } catch (err) {
    throw new GatewayError('GW_ERR_PKI_BAD_KEY', `${what} is not a PEM private key`, {
      details: { reason: reason(err, pem) },
    });
  }
}

export function loadPublicKey(pem: string, what: string): KeyObject {
  try {
    return createPublicKey({ key: pem, format: 'pem' });
  } catch (err) {
    throw new GatewayError('GW_ERR_PKI_BAD_KEY', `${what} is not a PEM public key`, {
      details: { reason: reason(err, pem) },
    });
  }
}

/** The OpenSSH public key line ("type base64", no comment) of a PEM public or private key. */
export function sshPublicKeyFromPem(pem: string): string {
  const key = /-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----/.test(pem)
    ? createPublicKey(loadPrivateKey(pem, 'the key'))
    : loadPublicKey(pem, 'the key');
  try {
    return lineFromBlob(sshBlobFromKey(key));
  } catch (err) {
    throw new GatewayError('GW_ERR_PKI_BAD_KEY', `the key has no SSH form the gateway supports`, {
      details: { reason: reason(err, pem) },
    });
  }
}

/** Whether two OpenSSH public key lines hold the same key (algorithm and blob; comments aside). */
export function sameSshLine(a: string, b: string): boolean {
  const [algoA, blobA] = a.trim().split(/\s+/);
  const [algoB, blobB] = b.trim().split(/\s+/);
  return blobA !== undefined && algoA === algoB && blobA === blobB;
}

/** Whether a PEM public key is the key of an OpenSSH public key line (same algorithm and blob); never throws. */
export function sameSshKey(publicKeyPem: string, sshLine: string): boolean {
  try {
    return sameSshLine(sshPublicKeyFromPem(publicKeyPem), sshLine);
  } catch {
    return false;
  }
}

/**
 * A PKCS#8 ECDSA private key re-encoded as SEC1 PEM ("-----BEGIN EC PRIVATE KEY-----"), the form ssh2's
 * utils.parseKey accepts (it does not read PKCS#8); OpenSSH reads both. Same key, different wrapping.
 */
export function sshPrivateKeyPem(privateKeyPem: string): string {
  const key = loadPrivateKey(privateKeyPem, 'the private key');
  if (key.asymmetricKeyType !== 'ec') {
    throw new GatewayError('GW_ERR_PKI_BAD_KEY', `only ECDSA private keys can be converted for ssh2`, {
      details: { keyType: key.asymmetricKeyType },
    });
  }
  return key.export({ type: 'sec1', format: 'pem' }) as string;
}
