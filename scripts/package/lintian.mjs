// lintian overrides shipped in the .deb packages (/usr/share/lintian/overrides/<name>), each with the reason.
// docs/install.md lists them. Filled in from lintian's own output on the built packages.
export const LINTIAN_OVERRIDES = {
  server: '',
  updater: '',
};
