/**
 * Who a request to the stand-in API server is: authentication (a client certificate the server's CA signed:
 * CN = user, O = groups; else a bearer token from the table the test passes; else 401, as a real server with
 * --anonymous-auth=false), then impersonation exactly as k8s.io/apiserver's WithImpersonation filter does it:
 * Impersonate-User (a system:serviceaccount:<ns>:<name> user is checked as the serviceaccounts resource),
 * each Impersonate-Group, each value of each Impersonate-Extra-<key> (resource userextras, subresource <key>,
 * group authentication.k8s.io), Impersonate-Uid (resource uids, same group); every one needs the `impersonate`
 * verb for that name, else 403 with the real message; groups, extras or a uid without a user are refused (the
 * real server answers 500 there, and so does this one). The impersonated user gets system:authenticated.
 */
import type { IncomingMessage } from 'node:http';
import type { TLSSocket } from 'node:tls';
import { authorize, type Attributes, type Binding, type UserInfo } from './rbac.js';
import { failure, forbidden, UNAUTHORIZED, type Status } from './status.js';

export interface TokenUser {
  user: string;
  groups?: string[];
  uid?: string;
}

export type Who = { ok: true; user: UserInfo; impersonatedBy?: UserInfo } | { ok: false; status: Status };

const withAuthenticated = (groups: string[], name: string): string[] =>
  name === 'system:anonymous' || groups.includes('system:authenticated') ? groups : [...groups, 'system:authenticated'];

function authenticate(req: IncomingMessage, tokens: Record<string, TokenUser>): UserInfo | undefined {
  const socket = req.socket as TLSSocket;
  const cert = socket.getPeerCertificate?.();
  if (cert && cert.subject && socket.authorized) {
    const cn = cert.subject.CN;
    const o = cert.subject.O;
    const name = Array.isArray(cn) ? cn[0] : cn;
    if (name) return { name, groups: withAuthenticated(Array.isArray(o) ? o : o ? [o] : [], name) };
  }
  const auth = req.headers.authorization;
  const m = auth === undefined ? null : /^Bearer\s+(\S+)\s*$/i.exec(auth);
  const entry = m ? Object.prototype.hasOwnProperty.call(tokens, m[1]!) ? tokens[m[1]!] : undefined : undefined;
  if (!entry) return undefined;
  return { name: entry.user, groups: withAuthenticated(entry.groups ?? [], entry.user), ...(entry.uid ? { uid: entry.uid } : {}) };
}

interface Ask {
  resource: string;
  subresource?: string;
  apiGroup: string;
  namespace?: string;
  name: string;
}

/** The real filter's unescapeExtraKey: percent-decoded, or as it is when that fails. */
function unescapeExtraKey(key: string): string {
  try {
    return decodeURIComponent(key);
  } catch {
    return key;
  }
}

/** buildImpersonationRequests: what the headers ask to act as, in the real filter's order. */
function impersonationRequests(req: IncomingMessage): Ask[] | { error: string } {
  const asks: Ask[] = [];
  const user = req.headers['impersonate-user'];
  const userName = Array.isArray(user) ? user[0] : user;
  if (userName) {
    const sa = /^system:serviceaccount:([^:]+):([^:]+)$/.exec(userName);
    asks.push(sa ? { resource: 'serviceaccounts', apiGroup: '', namespace: sa[1]!, name: sa[2]! } : { resource: 'users', apiGroup: '', name: userName });
  }
  const raw = req.rawHeaders;
  const values = (h: string) => raw.flatMap((v, i) => (i % 2 === 0 && v.toLowerCase() === h ? [raw[i + 1]!] : []));
  for (const g of values('impersonate-group')) asks.push({ resource: 'groups', apiGroup: '', name: g });
  for (let i = 0; i < raw.length; i += 2) {
    const h = raw[i]!.toLowerCase();
    if (!h.startsWith('impersonate-extra-')) continue;
    asks.push({ resource: 'userextras', subresource: unescapeExtraKey(h.slice('impersonate-extra-'.length)), apiGroup: 'authentication.k8s.io', name: raw[i + 1]! });
  }
  const uid = req.headers['impersonate-uid'];
  if (typeof uid === 'string' && uid !== '') asks.push({ resource: 'uids', apiGroup: 'authentication.k8s.io', name: uid });
  if (asks.length > 0 && !userName) return { error: `requested ${JSON.stringify(asks)} without impersonating a user` };
  return asks;
}

export function identify(req: IncomingMessage, tokens: Record<string, TokenUser>, bindings: Binding[]): Who {
  const requestor = authenticate(req, tokens);
  if (!requestor) return { ok: false, status: UNAUTHORIZED };
  const asks = impersonationRequests(req);
  if ('error' in asks) return { ok: false, status: failure(500, 'InternalError', `Internal Server Error: "${req.url ?? ''}": ${asks.error}`) };
  if (asks.length === 0) return { ok: true, user: requestor };
  let name = '';
  let groups: string[] = [];
  let groupsGiven = false;
  let uid: string | undefined;
  const extra: Record<string, string[]> = {};
  for (const ask of asks) {
    const a: Attributes = {
      user: requestor, verb: 'impersonate', resourceRequest: true, path: req.url ?? '', apiGroup: ask.apiGroup, apiVersion: 'v1',
      namespace: ask.namespace ?? '', resource: ask.resource, subresource: ask.subresource ?? '', name: ask.name,
    };
    if (!authorize(bindings, a)) return { ok: false, status: forbidden(a) };
    if (ask.resource === 'users') name = ask.name;
    if (ask.resource === 'serviceaccounts') name = `system:serviceaccount:${ask.namespace}:${ask.name}`;
    if (ask.resource === 'groups') { groups.push(ask.name); groupsGiven = true; }
    if (ask.resource === 'userextras') (extra[ask.subresource!] ??= []).push(ask.name);
    if (ask.resource === 'uids') uid = ask.name;
  }
  const sa = /^system:serviceaccount:([^:]+):/.exec(name);
  if (sa && !groupsGiven) groups = ['system:serviceaccounts', `system:serviceaccounts:${sa[1]}`];
  const user: UserInfo = { name, groups: withAuthenticated(groups, name), ...(uid ? { uid } : {}), ...(Object.keys(extra).length ? { extra } : {}) };
  return { ok: true, user, impersonatedBy: requestor };
}
