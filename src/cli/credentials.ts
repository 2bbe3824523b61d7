/**
 * Which identity gwctl acts with:
 *  1. --auth-server, --data-dir or -c given: the Auth Service's local admin identity from the data directory
 *     (full permissions; whoever can read <data_dir>/admin/ is an administrator), against the Auth API.
 *  2. otherwise the gwsh profile (the signed-in user and their roles), against the Proxy's web port.
 *  3. otherwise the local admin identity of the default data directory, if readable.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ApiClient } from '../client/api.js';
import { checkNotExpired, loadProfile } from '../client/profile.js';
import { loadConfigFile } from '../config/index.js';
import { GatewayError } from '../errors.js';
import { defaultDataDir } from '../paths.js';

export interface CredentialOptions {
  authServer?: string;
  dataDir?: string;
  config?: string;
}


function adminClient(dataDir: string, authServer: string | undefined, explicit: boolean): ApiClient | undefined {
  const dir = join(dataDir, 'admin');
  try {
    const key = readFileSync(join(dir, 'key.pem'), 'utf8');
    const cert = readFileSync(join(dir, 'cert.pem'), 'utf8');
    const ca = readFileSync(join(dir, 'host-ca.pem'), 'utf8');
    const address = authServer ?? readFileSync(join(dir, 'auth-addr'), 'utf8').trim();
    return new ApiClient({ address, ca, cert, key, server: 'auth' });
  } catch (err) {
    if (!explicit) return undefined;
    const e = err as NodeJS.ErrnoException;
    throw new GatewayError('GW_ERR_CLIENT_NO_CREDENTIALS', `cannot use the local admin identity in ${dir}: ${e.code ?? e.message}`, {
      hint: e.code === 'EACCES' ? 'Run gwctl as the user that runs the Auth Service (often root).' : 'Start the Auth Service with this data directory first.',
    });
  }
}

export function gwctlClient(options: CredentialOptions): ApiClient {
  if (options.authServer || options.dataDir || options.config) {
    const dataDir = options.dataDir ?? (options.config ? loadConfigFile(options.config).gateway.data_dir : defaultDataDir());
    return adminClient(dataDir, options.authServer, true)!;
  }
  const profile = loadProfile();
  if (profile) {
    checkNotExpired(profile);
    return new ApiClient({ address: profile.proxy, ca: profile.hostCa, cert: profile.cert, key: profile.key });
  }
  const local = adminClient(defaultDataDir(), undefined, false);
  if (local) return local;
  throw new GatewayError('GW_ERR_CLIENT_NO_CREDENTIALS', 'no credentials: not signed in, and no local Auth Service data directory is readable', {
    hint: `Sign in with 'gwsh login --proxy=HOST:PORT --user=USER', or run gwctl on the Auth Service's machine as the user that started it (with --data-dir if its data is not in ${defaultDataDir()}).`,
  });
}

/**
 * gwctl probe: the Proxy's web port is where a probe starts. A signed-in user's profile names it; the local
 * admin identity names only the Auth API, so it needs --proxy (the identity is the same, the address the Proxy's).
 */
export function gwctlProxyClient(options: CredentialOptions, proxy: string | undefined): ApiClient {
  const base = gwctlClient(options);
  if (proxy) return base.at(proxy);
  if (base.server === 'auth') {
    throw new GatewayError('GW_ERR_USAGE', 'gwctl probe with the local admin identity needs the Proxy to start from', {
      hint: "Give --proxy HOST:PORT (the Proxy's web address), or sign in with 'gwsh login' and run gwctl without --data-dir.",
    });
  }
  return base;
}
