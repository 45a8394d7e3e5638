//! maintenance (to be written)
