/** The product version: gwctl and gwsh are 17.0.0-dev or later. */
export const VERSION = '17.0.0-dev';
