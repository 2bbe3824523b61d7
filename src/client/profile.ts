/**
 * The gwsh profile: what `gwsh login` received, kept in ~/.gwsh (or $GWSH_HOME) with the private key 0600.
 * gwctl uses it too, so that an admin who signed in acts with their own roles.
 *
 * Trust is kept apart from credentials: known_cas.json holds the cluster CA of each Proxy address signed in to
 * (checked against a --ca-pin, or received over a verified connection). `gwsh logout` removes the credentials
 * only, so a later login to the same address needs no pin; a new --ca-pin replaces the kept CA.
 */
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { createPrivateKey } from 'node:crypto';
import { identityFromCert, sshPublicKeyFromPem, type Identity } from '../auth/pki.js';
import type { CertBundle } from '../wire/certs.js';
import { GatewayError } from '../errors.js';
import { readIfExists, writePublicFile, writeSecretFile } from '../fsutil.js';

export interface ProfileFile {
  proxy: string;
  username: string;
  cluster: string;
  valid_until: string;
}

export interface Profile extends ProfileFile {
  dir: string;
  key: string;
  cert: string;
  sshCert: string;
  hostCa: string;
  identity: Identity;
}

export function profileDir(env: NodeJS.ProcessEnv = process.env): string {
  return env.GWSH_HOME && env.GWSH_HOME.trim() !== '' ? env.GWSH_HOME : join(homedir(), '.gwsh');
}

export function saveProfile(dir: string, proxy: string, username: string, privateKeyPem: string, bundle: CertBundle): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  writeSecretFile(join(dir, 'key.pem'), privateKeyPem);
  writeSecretFile(join(dir, 'cert.pem'), bundle.tlsCert);
  writeSecretFile(join(dir, 'ssh-cert.pub'), `${bundle.sshCert}\n`);
  // OpenSSH's own layout, so that ssh pairs the key with its certificate: ssh-key, ssh-key.pub, ssh-key-cert.pub.
  writeSecretFile(join(dir, 'ssh-key'), createPrivateKey(privateKeyPem).export({ type: 'sec1', format: 'pem' }) as string);
  writePublicFile(join(dir, 'ssh-key.pub'), `${sshPublicKeyFromPem(privateKeyPem)}\n`);
  writePublicFile(join(dir, 'ssh-key-cert.pub'), `${bundle.sshCert}\n`);
  writePublicFile(join(dir, 'host-ca.pem'), bundle.hostCaPem);
  writePublicFile(join(dir, 'ssh-host-ca.pub'), `${bundle.sshHostCa}\n`);
  const file: ProfileFile = { proxy, username, cluster: bundle.clusterName, valid_until: bundle.validUntil };
  writeSecretFile(join(dir, 'profile.json'), `${JSON.stringify(file, null, 2)}\n`);
  rememberCa(dir, proxy, bundle.clusterName, bundle.hostCaPem);
}

// --- trusted cluster CAs, by Proxy address -------------------------------------------------------------------------

const KNOWN_CAS = 'known_cas.json';
/** Bounds on what is read back: a damaged or hostile file cannot make gwsh read or keep without limit. */
const MAX_KNOWN_CAS_BYTES = 1024 * 1024;
const MAX_KNOWN_CAS = 64;

export interface KnownCa {
  cluster: string;
  /** The cluster's host CA (PEM) that the Proxy's certificate must chain to. */
  host_ca: string;
}

function readKnownCas(dir: string): Record<string, KnownCa> {
  const text = readIfExists(join(dir, KNOWN_CAS));
  if (text === undefined || text.length > MAX_KNOWN_CAS_BYTES) return {};
  try {
    const parsed = JSON.parse(text) as unknown;
    if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return {};
    const out: Record<string, KnownCa> = {};
    for (const [proxy, v] of Object.entries(parsed as Record<string, unknown>).slice(0, MAX_KNOWN_CAS)) {
      const e = v as Partial<KnownCa> | null;
      if (e && typeof e.cluster === 'string' && typeof e.host_ca === 'string') out[proxy] = { cluster: e.cluster, host_ca: e.host_ca };
    }
    return out;
  } catch {
    return {};
  }
}

/** The CA kept for this Proxy address (host:port as normalizeAddress writes it), if any. */
export function knownCa(dir: string, proxy: string): KnownCa | undefined {
  const all = readKnownCas(dir);
  return Object.hasOwn(all, proxy) ? all[proxy] : undefined;
}

/** Keeps the cluster CA for this Proxy address (the newest replaces an older one; the oldest go past the bound). */
export function rememberCa(dir: string, proxy: string, cluster: string, hostCa: string): void {
  const { [proxy]: _old, ...others } = readKnownCas(dir);
  const kept = Object.fromEntries([...Object.entries(others).slice(-(MAX_KNOWN_CAS - 1)), [proxy, { cluster, host_ca: hostCa }]]);
  writePublicFile(join(dir, KNOWN_CAS), `${JSON.stringify(kept, null, 2)}\n`);
}

/**
 * Throws GW_ERR_CLIENT_CERT_EXPIRED when the profile's user certificate is no longer valid at now: said here, with
 * the login command that renews it, rather than as the server's refusal (or, under ssh, as OpenSSH's noise).
 */
export function checkNotExpired(profile: Pick<Profile, 'valid_until' | 'proxy' | 'username' | 'cluster'>, now = Date.now()): void {
  const until = Date.parse(profile.valid_until);
  if (Number.isNaN(until) || until > now) return;
  throw new GatewayError('GW_ERR_CLIENT_CERT_EXPIRED', `your certificate for cluster ${profile.cluster} expired at ${profile.valid_until}`, {
    hint: `Run 'gwsh login --proxy=${profile.proxy} --user=${profile.username}' for a fresh one.`,
    details: { valid_until: profile.valid_until },
  });
}

/** The profile, or undefined when there is none. A damaged profile is an error saying how to start over. */
export function loadProfile(dir = profileDir()): Profile | undefined {
  let text: string;
  try {
    text = readFileSync(join(dir, 'profile.json'), 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new GatewayError('GW_ERR_CLIENT_PROFILE', `cannot read the profile in ${dir}: ${(err as Error).message}`);
  }
  try {
    const file = JSON.parse(text) as ProfileFile;
    const cert = readFileSync(join(dir, 'cert.pem'), 'utf8');
    return {
      ...file,
      dir,
      key: readFileSync(join(dir, 'key.pem'), 'utf8'),
      cert,
      sshCert: readFileSync(join(dir, 'ssh-cert.pub'), 'utf8').trim(),
      hostCa: readFileSync(join(dir, 'host-ca.pem'), 'utf8'),
      identity: identityFromCert(cert),
    };
  } catch (err) {
    throw new GatewayError('GW_ERR_CLIENT_PROFILE', `the profile in ${dir} is damaged: ${(err as Error).message}`, {
      hint: "Run 'gwsh logout' and 'gwsh login' again.",
    });
  }
}

/** Removes the credentials (keys, certificates, the profile); the kept CAs (known_cas.json) stay. */
export function removeProfile(dir = profileDir()): boolean {
  const had = loadProfileQuiet(dir);
  for (const f of ['profile.json', 'key.pem', 'cert.pem', 'ssh-cert.pub', 'host-ca.pem', 'ssh-host-ca.pub', 'ssh-key', 'ssh-key.pub', 'ssh-key-cert.pub', 'ssh_config']) {
    rmSync(join(dir, f), { force: true });
  }
  return had;
}

function loadProfileQuiet(dir: string): boolean {
  try {
    readFileSync(join(dir, 'profile.json'));
    return true;
  } catch {
    return false;
  }
}
