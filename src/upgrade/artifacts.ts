/**
 * Where gateway-upgrade takes releases from: the download site and the package repository as set
 * (GATEWAY_UPGRADE_DOWNLOAD_URL, GATEWAY_UPGRADE_APT_REPO_URL / _YUM_REPO_URL), or, with GATEWAY_UPGRADE_ARTIFACTS=proxy,
 * the Proxy the endpoint file names: its artifact route for tarballs and its repository route for packages
 * (src/wire/artifacts.ts), for hosts that reach only the Proxy. What is fetched is checked exactly as a direct
 * download is (the tarball's .sha256, the package manager's signatures); only the address changes, and the
 * certificate check of the download location (download.ts) takes a Proxy's.
 */
import { ARTIFACTS_PATH, REPO_PATH } from '../wire/artifacts.js';
import type { Endpoint } from './endpoint.js';
import type { UpgraderSettings } from './settings.js';

/** {download_url}: the release tarballs' location. */
export function downloadUrl(s: Pick<UpgraderSettings, 'artifacts' | 'downloadUrl'>, endpoint: Pick<Endpoint, 'origin'>): string {
  return s.artifacts === 'proxy' ? `${endpoint.origin}${ARTIFACTS_PATH}` : s.downloadUrl;
}

/** The Proxy's repository route for an endpoint: what a repository entry names when packages come through the Proxy. */
export function proxyRepoUrl(endpoint: Pick<Endpoint, 'origin'>): string {
  return `${endpoint.origin}${REPO_PATH}`;
}
