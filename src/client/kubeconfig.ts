/**
 * What `gwsh kube login CLUSTER` (and `gwsh proxy kube CLUSTER --kubeconfig FILE`) writes: one cluster, user and context in a kubeconfig, merged into the file
 * kubectl reads (--kubeconfig FILE, else the first file of $KUBECONFIG, as kubectl writes there too, else
 * ~/.kube/config), as upstream's `tsh kube login` does. Every other entry, comment and setting of the file is
 * kept (the yaml package's document API edits the parsed document in place); an entry of the same name is
 * replaced; current-context becomes the new one.
 *
 * Decisions:
 *  - server https://<Proxy address>/k8s/<cluster>, and always a tls-server-name: the Proxy routes Kubernetes by
 *    server name, and kubectl sends this one whatever the server's host, so the kube- name never has to resolve
 *    (no wildcard DNS record needed, an IP works, HTTPS_PROXY works). For a Proxy reached by name it is
 *    kube-gateway-proxy-alpn.<host> (its certificate has *.<host>); for one reached by IP address, which has no
 *    name to put it under, kube-gateway-proxy-alpn.gateway.cluster.local (KUBE_LOCAL_SNI, which the certificate
 *    the cluster issues such a Proxy carries). With a separate Kubernetes listener (kube_listen_addr) the address
 *    is that listener's public address, the name the same.
 *  - the user's certificate and key, and the cluster CA, by path in the gwsh profile (0600 there), not copied: a
 *    new `gwsh login` renews them for kubectl too, and no second copy of the key is left behind by a logout.
 *  - entries are named <gateway cluster>-<kube cluster>; gwsh proxy kube's <gateway cluster>-<kube cluster>-proxy,
 *    whose server is http://127.0.0.1:<port>/k8s/<cluster> and whose user holds nothing (gwsh holds the
 *    credentials: src/client/kubeproxy.ts).
 *
 * Bad input loses nothing: a file that is not YAML, not a mapping, whose clusters, users or contexts are not
 * lists, or larger than MAX_KUBECONFIG_BYTES, is refused (GW_ERR_CLIENT_KUBECONFIG) before anything is written;
 * the write is atomic (a temp file renamed over it), so a failed one (GW_ERR_CLIENT_KUBECONFIG_WRITE) leaves the
 * file as it was. A symbolic link is followed: the file it names is replaced, the link stays.
 */
import { closeSync, fstatSync, openSync, readSync, realpathSync, statSync } from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, join } from 'node:path';
import { isMap, isSeq, parseDocument, YAMLMap, YAMLSeq, type Document } from 'yaml';
import { GatewayError } from '../errors.js';
import { writeFileAtomic } from '../fsutil.js';

/** The largest kubeconfig read: real ones with hundreds of contexts stay well under 1 MiB. */
export const MAX_KUBECONFIG_BYTES = 4 * 1024 * 1024;
/** Mode of a kubeconfig gwsh creates (it names key files; kubectl warns about group/world-readable ones). */
const NEW_FILE_MODE = 0o600;

export interface KubeLoginEntry {
  /** The entries' name (cluster, user and context alike). */
  name: string;
  server: string;
  /** TLS to the Proxy (gwsh kube login); none for gwsh proxy kube's http:// listener on loopback (no credential either). */
  tls?: { tlsServerName: string; caFile: string; certFile: string; keyFile: string };
}

/** The file to write: --kubeconfig, else the first file of $KUBECONFIG, else ~/.kube/config. */
export function kubeconfigPath(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): string {
  if (flag) return flag;
  const first = (env.KUBECONFIG ?? '').split(delimiter).find((p) => p.trim() !== '');
  return first ?? join(homedir(), '.kube', 'config');
}

function invalid(file: string, why: string): GatewayError {
  return new GatewayError('GW_ERR_CLIENT_KUBECONFIG', `the kubeconfig ${file} ${why}; it was left as it was`);
}

/** The named list of the document (clusters, users, contexts), made when missing; anything else is refused. */
function listOf(doc: Document, key: string, file: string): YAMLSeq {
  const node = doc.get(key, true);
  if (node === undefined || node === null || (typeof node === 'object' && 'value' in node && (node as { value: unknown }).value === null)) {
    const seq = new YAMLSeq();
    doc.set(key, seq);
    return seq;
  }
  if (!isSeq(node)) throw invalid(file, `has a "${key}" that is not a list`);
  return node;
}

/** Puts item (a mapping with a name) into list: replacing the entry of that name, else at the end. */
function put(doc: Document, list: YAMLSeq, name: string, item: Record<string, unknown>): void {
  const node = doc.createNode(item);
  const at = list.items.findIndex((i) => isMap(i) && (i as YAMLMap).get('name') === name);
  if (at >= 0) list.items[at] = node;
  else list.items.push(node);
}

/** Pure: the kubeconfig text with entry merged in (text undefined: a new file). */
export function mergeKubeconfig(text: string | undefined, file: string, entry: KubeLoginEntry): string {
  const doc = parseDocument(text ?? '');
  if (doc.errors.length > 0) {
    // Where only: the parser's message quotes the line, which may hold a token.
    const at = doc.errors[0]!.linePos?.[0];
    throw invalid(file, `is not YAML${at ? ` (line ${at.line}, column ${at.col})` : ''}`);
  }
  if (doc.contents === null || doc.contents === undefined) doc.contents = doc.createNode({ apiVersion: 'v1', kind: 'Config', preferences: {} }) as never;
  if (!isMap(doc.contents)) throw invalid(file, 'is not a mapping');
  const clusters = listOf(doc, 'clusters', file);
  const users = listOf(doc, 'users', file);
  const contexts = listOf(doc, 'contexts', file);
  const t = entry.tls;
  put(doc, clusters, entry.name, { name: entry.name, cluster: { server: entry.server, ...(t ? { 'tls-server-name': t.tlsServerName, 'certificate-authority': t.caFile } : {}) } });
  put(doc, users, entry.name, { name: entry.name, user: t ? { 'client-certificate': t.certFile, 'client-key': t.keyFile } : {} });
  put(doc, contexts, entry.name, { name: entry.name, context: { cluster: entry.name, user: entry.name } });
  doc.set('current-context', entry.name);
  return doc.toString();
}

/** The file's text (undefined when there is none), at most MAX_KUBECONFIG_BYTES. */
function readKubeconfig(file: string): string | undefined {
  let fd: number;
  try {
    fd = openSync(file, 'r');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new GatewayError('GW_ERR_CLIENT_KUBECONFIG_WRITE', `cannot read the kubeconfig ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  try {
    if (!fstatSync(fd).isFile()) throw invalid(file, 'is not a regular file');
    const buf = Buffer.alloc(MAX_KUBECONFIG_BYTES + 1);
    let n = 0;
    for (let got = -1; got !== 0 && n <= MAX_KUBECONFIG_BYTES; n += got) got = readSync(fd, buf, n, MAX_KUBECONFIG_BYTES + 1 - n, null);
    if (n > MAX_KUBECONFIG_BYTES) throw invalid(file, `is larger than ${MAX_KUBECONFIG_BYTES} bytes`);
    return buf.subarray(0, n).toString('utf8');
  } finally {
    closeSync(fd);
  }
}

/** Merges entry into the kubeconfig at file (see the file comment); returns the path written. */
export function writeKubeconfig(file: string, entry: KubeLoginEntry): string {
  let target = file;
  try {
    target = realpathSync(file);
  } catch {
    // not there yet: created below
  }
  const text = readKubeconfig(target);
  const merged = mergeKubeconfig(text, file, entry);
  let mode = NEW_FILE_MODE;
  try {
    mode = statSync(target).mode & 0o777;
  } catch {
    // a new file
  }
  try {
    writeFileAtomic(target, merged, { mode, dirMode: 0o700 });
  } catch (err) {
    throw new GatewayError('GW_ERR_CLIENT_KUBECONFIG_WRITE', `cannot write the kubeconfig ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  return target;
}
