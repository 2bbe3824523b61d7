/**
 * How the Kubernetes Service proves itself to an API server (kube_service.clusters[].credentials):
 *  - in_cluster: the pod's projected service-account token and CA (service_account_dir). The kubelet rotates the
 *    token file in place (an atomic symlink swap), so the file is stat'ed on every request and re-read when its
 *    identity (inode, size, mtime) changes, and re-read regardless after the API server answers 401 (a rotation
 *    the stat missed). Nothing is cached past a change: a rotated token is used on the next request.
 *  - kubeconfig: the token (token or tokenFile) or client certificate and key of a context's user, and the
 *    context's cluster CA, read the same way (the file re-read when it changes). exec plugins, auth-provider,
 *    username/password and insecure-skip-tls-verify are refused (GW_ERR_KUBE_AUTH_UNSUPPORTED): running a
 *    plugin means running a program the kubeconfig names, with its own refresh protocol; a cloud cluster gives
 *    the agent a service-account token instead.
 *  - none: no credential (an API server that checks none).
 * Every file read is bounded (a token, a PEM or a kubeconfig larger than its cap is refused, not read whole).
 * The token is never logged and never leaves this module except as the Authorization header's value.
 */
import { closeSync, fstatSync, openSync, readSync, statSync } from 'node:fs';
import { dirname, isAbsolute, join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import type { KubeClusterConfig } from '../config/index.js';
import { GatewayError } from '../errors.js';

/** Caps on what is read: a service-account token is ~1 KiB, a CA bundle a few KiB, a kubeconfig rarely 100 KiB. */
export const MAX_TOKEN_BYTES = 64 * 1024;
export const MAX_PEM_BYTES = 1024 * 1024;
export const MAX_KUBECONFIG_BYTES = 1024 * 1024;

export interface KubeTls {
  readonly ca?: string;
  readonly cert?: string;
  readonly key?: string;
}

export interface KubeCredentials {
  /** TLS material for the connection to the API server (CA to trust, client certificate to show). */
  tls(): KubeTls;
  /** The Authorization header to send, or undefined when the credential is a certificate or none. */
  authorization(): string | undefined;
  /** The API server answered 401: the next request re-reads the token whatever its file's stat says. */
  rejected(): void;
}

function credentialError(message: string): GatewayError {
  return new GatewayError('GW_ERR_KUBE_CREDENTIALS', message);
}

/** Reads at most max bytes of path; a longer file is refused (it is not a credential). */
export function readBounded(path: string, max: number, what: string): string {
  let fd: number;
  try {
    fd = openSync(path, 'r');
  } catch (err) {
    throw credentialError(`cannot read the ${what} ${path}: ${(err as Error).message}`);
  }
  try {
    if (!fstatSync(fd).isFile()) throw credentialError(`the ${what} ${path} is not a regular file`);
    const buf = Buffer.alloc(max + 1);
    let n = 0;
    for (let got = -1; got !== 0 && n <= max; n += got) got = readSync(fd, buf, n, max + 1 - n, null);
    if (n > max) throw credentialError(`the ${what} ${path} is larger than ${max} bytes`);
    return buf.subarray(0, n).toString('utf8');
  } finally {
    closeSync(fd);
  }
}

/** One file, re-read when its identity changes (or when told to); the parsed value is kept until then. */
class WatchedFile<T> {
  private seen = '';
  private value: T | undefined;
  constructor(
    private readonly path: string,
    private readonly parse: (text: string) => T,
    private readonly max: number,
    private readonly what: string,
  ) {}
  get(force = false): T {
    let id: string;
    try {
      const st = statSync(this.path);
      id = `${st.ino}:${st.size}:${st.mtimeMs}`;
    } catch (err) {
      throw credentialError(`cannot read the ${this.what} ${this.path}: ${(err as Error).message}`);
    }
    if (force || this.value === undefined || id !== this.seen) {
      this.value = this.parse(readBounded(this.path, this.max, this.what));
      this.seen = id;
    }
    return this.value;
  }
}

function tokenOf(path: string): (text: string) => string {
  return (text) => {
    const token = text.trim();
    if (token === '') throw credentialError(`the token file ${path} is empty`);
    // A header value may not carry control characters; a token with one is not a token.
    if (!/^[\x21-\x7e]+$/.test(token)) throw credentialError(`the token file ${path} holds characters a bearer token cannot`);
    return token;
  };
}

/** in_cluster: the token and CA of the pod's service account. */
export function inClusterCredentials(dir: string, caFile: string | undefined): KubeCredentials {
  const tokenPath = join(dir, 'token');
  const token = new WatchedFile(tokenPath, tokenOf(tokenPath), MAX_TOKEN_BYTES, 'service-account token');
  const ca = new WatchedFile(caFile ?? join(dir, 'ca.crt'), (t) => t, MAX_PEM_BYTES, 'CA');
  let force = false;
  return {
    tls: () => ({ ca: ca.get() }),
    authorization: () => {
      const value = token.get(force);
      force = false;
      return `Bearer ${value}`;
    },
    rejected: () => {
      force = true;
    },
  };
}

interface Resolved {
  readonly tls: KubeTls;
  readonly token?: string;
  readonly tokenFile?: string;
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The entry of a kubeconfig list (clusters, users, contexts) with this name. */
function named(doc: Obj, list: string, name: string, file: string): Obj {
  const items = Array.isArray(doc[list]) ? (doc[list] as unknown[]) : [];
  const found = items.find((i) => isObj(i) && i.name === name);
  const inner = isObj(found) ? found[list === 'contexts' ? 'context' : list === 'users' ? 'user' : 'cluster'] : undefined;
  if (!isObj(inner)) throw credentialError(`the kubeconfig ${file} has no ${list.slice(0, -1)} named "${name}"`);
  return inner;
}

function unsupported(file: string, what: string): GatewayError {
  return new GatewayError('GW_ERR_KUBE_AUTH_UNSUPPORTED', `the kubeconfig ${file} uses ${what}, which the Kubernetes Service does not run`);
}

/** PEM given inline (base64 in *-data) or as a file (relative to the kubeconfig's directory, as kubectl reads it). */
function pem(entry: Obj, key: string, file: string): string | undefined {
  const data = entry[`${key}-data`];
  if (typeof data === 'string') return Buffer.from(data, 'base64').toString('utf8');
  const path = entry[key];
  if (typeof path !== 'string') return undefined;
  return readBounded(isAbsolute(path) ? path : join(dirname(file), path), MAX_PEM_BYTES, key);
}

/** Pure but for the files it names: what a kubeconfig's context says about reaching its cluster. */
export function resolveKubeconfig(text: string, file: string, context: string | undefined): Resolved {
  let doc: unknown;
  try {
    doc = parseYaml(text, { maxAliasCount: 100 });
  } catch (err) {
    // Only where: the parser's message quotes the line, which may hold a token (the error reaches the user).
    const at = (err as { linePos?: Array<{ line: number; col: number }> }).linePos?.[0];
    throw credentialError(`the kubeconfig ${file} is not YAML${at ? ` (line ${at.line}, column ${at.col})` : ''}`);
  }
  if (!isObj(doc)) throw credentialError(`the kubeconfig ${file} is not a mapping`);
  const ctxName = context ?? doc['current-context'];
  if (typeof ctxName !== 'string' || ctxName === '') throw credentialError(`the kubeconfig ${file} has no current-context; set kubeconfig_context`);
  const ctx = named(doc, 'contexts', ctxName, file);
  const user = typeof ctx.user === 'string' ? named(doc, 'users', ctx.user, file) : undefined;
  const cluster = typeof ctx.cluster === 'string' ? named(doc, 'clusters', ctx.cluster, file) : undefined;
  if (!user) throw credentialError(`the kubeconfig ${file}'s context "${ctxName}" names no user`);
  if (user.exec !== undefined) throw unsupported(file, 'an exec plugin');
  if (user['auth-provider'] !== undefined) throw unsupported(file, 'an auth-provider');
  if (user.username !== undefined || user.password !== undefined) throw unsupported(file, 'a username and password');
  if (cluster?.['insecure-skip-tls-verify'] === true) throw unsupported(file, 'insecure-skip-tls-verify');
  const ca = cluster ? pem(cluster, 'certificate-authority', file) : undefined;
  const cert = pem(user, 'client-certificate', file);
  const key = pem(user, 'client-key', file);
  if ((cert === undefined) !== (key === undefined)) throw credentialError(`the kubeconfig ${file}'s user "${String(ctx.user)}" has a client certificate without its key, or a key without its certificate`);
  const tls: KubeTls = { ...(ca ? { ca } : {}), ...(cert && key ? { cert, key } : {}) };
  if (typeof user.token === 'string' && user.token !== '') return { tls, token: user.token };
  if (typeof user.tokenFile === 'string') return { tls, tokenFile: isAbsolute(user.tokenFile) ? user.tokenFile : join(dirname(file), user.tokenFile) };
  if (!cert) throw credentialError(`the kubeconfig ${file}'s user "${String(ctx.user)}" has no token, tokenFile or client certificate`);
  return { tls };
}

/** kubeconfig: a context's token or client certificate, and its CA unless ca_file is set. */
export function kubeconfigCredentials(file: string, context: string | undefined, caFile: string | undefined): KubeCredentials {
  const config = new WatchedFile(file, (t) => resolveKubeconfig(t, file, context), MAX_KUBECONFIG_BYTES, 'kubeconfig');
  const tokenFiles = new Map<string, WatchedFile<string>>();
  const ca = caFile ? new WatchedFile(caFile, (t) => t, MAX_PEM_BYTES, 'CA') : undefined;
  let force = false;
  return {
    tls: () => ({ ...config.get().tls, ...(ca ? { ca: ca.get() } : {}) }),
    authorization: () => {
      const r = config.get(force);
      let token = r.token;
      if (r.tokenFile) {
        let watched = tokenFiles.get(r.tokenFile);
        if (!watched) tokenFiles.set(r.tokenFile, (watched = new WatchedFile(r.tokenFile, tokenOf(r.tokenFile), MAX_TOKEN_BYTES, 'token file')));
        token = watched.get(force);
      }
      force = false;
      return token === undefined ? undefined : `Bearer ${token}`;
    },
    rejected: () => {
      force = true;
    },
  };
}

/** The credential a cluster's configuration asks for. */
export function kubeCredentials(cluster: KubeClusterConfig): KubeCredentials {
  switch (cluster.credentials) {
    case 'in_cluster':
      return inClusterCredentials(cluster.service_account_dir, cluster.ca_file);
    case 'kubeconfig':
      return kubeconfigCredentials(cluster.kubeconfig!, cluster.kubeconfig_context, cluster.ca_file);
    default: {
      const ca = cluster.ca_file ? new WatchedFile(cluster.ca_file, (t) => t, MAX_PEM_BYTES, 'CA') : undefined;
      return { tls: () => (ca ? { ca: ca.get() } : {}), authorization: () => undefined, rejected: () => undefined };
    }
  }
}
