/**
 * The gwsh profile: what `gwsh login` received, kept in ~/.gwsh (or $GWSH_HOME) with the private key 0600.
 * gwctl uses it too, so that an admin who signed in acts with their own roles.
 */
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { createPrivateKey } from 'node:crypto';
import { identityFromCert, sshPublicKeyFromPem, type Identity } from '../auth/pki.js';
import type { CertBundle } from '../auth/service.js';
import { GatewayError } from '../errors.js';
import { writePublicFile, writeSecretFile } from '../fsutil.js';

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
