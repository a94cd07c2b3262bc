pub(crate) mod dial_back;
pub(crate) mod dial_request;
